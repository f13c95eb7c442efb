"""Renderers: pure functions of the data (stats, snapshots, traces) to text, matplotlib figures,
widget payloads and HTML. Never touch an allocator.
"""
