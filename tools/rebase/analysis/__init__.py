"""Read-only analysis of two stacks: patch pairing, absorption, lint, conflict causes, dependents,
base comparison and review focus."""
