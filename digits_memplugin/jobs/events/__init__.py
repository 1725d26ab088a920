"""What running jobs tell: progress records kept and passed on, and their pace (speed, time left)."""
