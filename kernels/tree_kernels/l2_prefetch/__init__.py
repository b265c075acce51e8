"""See naive.py for what is read and how it is checked."""
