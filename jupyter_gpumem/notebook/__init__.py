"""The IPython side: the extension, the magics and their subcommands, the per-cell ledger, the live
widget, traces and the OOM panel.
"""
