"""One-row linear layers (the AR step's GEMMs): y = x @ W.T for x [1, K]; see naive.py."""
