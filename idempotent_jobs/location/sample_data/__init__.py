"""Sample documents per subject for the offline collector."""
