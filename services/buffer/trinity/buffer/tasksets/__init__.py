"""Task sets: rows from files, handed out by a selector under leases, with a difficulty curriculum."""
