"""miles' command line checked against upstream miles' own parser (docs/conformance.md): the parser records both
sides compare (``parser_spec``), the comparison (``compare``) against the departures table (configuration's data,
``miles/config/departures.toml``) and the separate venv that holds upstream (``upstream_env``)."""
