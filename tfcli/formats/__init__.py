"""Markup, placeholders and file formats for `tfcli translate` (torch-free): markup.py reads a segment's inline
markup and puts it back by alignment, placeholders.py finds what no translation may change, files.py reads and
writes whole files. Public: `read_xml`, `read_html`, `Markup`, `placeholder_pattern`."""

from tfcli.formats.markup import Markup, read_html, read_xml
from tfcli.formats.placeholders import pattern as placeholder_pattern

__all__ = ["Markup", "read_html", "read_xml", "placeholder_pattern"]
