"""quickstart: A Flower / PyTorch app."""
