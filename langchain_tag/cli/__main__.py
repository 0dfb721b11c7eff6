"""`python -m langchain_tag.cli`: the `tag` command."""

from langchain_tag.cli import main

raise SystemExit(main())
