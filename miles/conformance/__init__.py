"""miles' command line checked against upstream miles' own parser (docs/conformance.md): the departures table
(``departures.toml``), the parser records both sides compare (``parser_spec``), the comparison (``compare``) and the
separate venv that holds upstream (``upstream_env``)."""
