"""What runs on the hardware to produce a Profile or an AcceptanceProfile."""
