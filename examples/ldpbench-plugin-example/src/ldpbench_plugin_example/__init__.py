"""An example ldpbench plugin (see README.md): one mechanism, `one-coordinate-rr`."""
