"""What a run shows and records as it goes: the structured log (logging.py), the console's handlers (console.py)
and progress as data (progress.py).
"""
