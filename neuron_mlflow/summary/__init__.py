"""The op summary (plain data) and its renderings: Markdown, CSV, side by side, comparisons."""
