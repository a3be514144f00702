"""An example Trinity plugin; each module holds one extension, found through this package's entry points."""
