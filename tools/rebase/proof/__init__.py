"""Evidence that the stack is right: test ids, test runs, per-patch proofs, the patch table and
`check`."""
