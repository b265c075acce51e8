"""See naive.py for the maths and shapes."""
