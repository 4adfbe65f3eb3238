"""util package."""
