"""The experiments of Task-Aligned Retrieval, on top of `langchain_tag`.

`evaluation` (the harness behind `tag eval`: tasks, methods, the oracle, metrics,
estimates and reports), `baselines` (the methods TAG is compared with) and `data`
(where the development data sets are). Not needed to use TAG: the library
(`langchain_tag`) stands alone.
"""
