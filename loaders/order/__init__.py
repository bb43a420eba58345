"""The sample order of an epoch, its split over consumers, and the resume state in global positions (numpy only)."""
