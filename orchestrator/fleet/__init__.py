"""A fleet: many plans in waves, on an embedded runner or on Temporal (docs/fleet.md)."""
