"""The plain data every layer speaks: the snapshot and trace schema, sizes and units, files, sites,
timeline columns, holders and segment replay. Imports nothing else of the package.
"""
