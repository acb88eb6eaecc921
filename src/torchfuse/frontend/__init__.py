"""torch's side of the boundary: aot_autograd and decompositions, torch's symbolic sizes as sympy,
Dynamo's events. The only code that uses torch internals; it imports nothing else of torchfuse
(docs/architecture.md, "Layers")."""
