"""Regenerate the configuration reference: ``python -m tierd.docgen > docs/configuration.md``."""

from tierd.config import reference_markdown

if __name__ == "__main__":
    print(reference_markdown(), end="")
