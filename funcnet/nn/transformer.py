"""(family file; layers are added here by the layer author's contract in docs/design.md)"""

__all__: list[str] = []
