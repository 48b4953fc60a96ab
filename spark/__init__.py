"""PySpark data source for the broker's streams (talks to a running broker over the network)."""
