"""What if: replay a recorded trace through our allocator under other settings."""
