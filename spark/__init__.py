"""PySpark data source for the broker's streams (talks to a running broker over the network).

``spark.dataSource.register(GatewayDataSource)`` makes format "gateway"
available to ``spark.read``, ``spark.readStream``, ``df.write`` and
``df.writeStream``.
"""
from spark.errors import BrokerError, BrokerUnreachable, DataLossError, GatewayError, OptionError, UnknownStream
from spark.source import GatewayDataSource

__all__ = [
    "GatewayDataSource", "GatewayError", "OptionError", "BrokerError", "BrokerUnreachable", "UnknownStream",
    "DataLossError",
]
