"""The `trinity` command: `run` (the whole stack on this machine), `submit`, `runs`, `serve`, `stack`, `model`,
`bench`."""
