"""The `shardsearch` command: one module per command, `render` for the text,
`args` for what they share, `main` to assemble and run them."""
