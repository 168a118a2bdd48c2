"""Predictions on new inputs from every fit's draws, through one cached forward function per structure."""
