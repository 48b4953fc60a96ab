"""Authentication and authorization: the users file, ``gateway passwd``, the authenticator, ``[auth]`` settings.

``settings`` is imported by the configuration and stays free of Twisted;
``security`` assembles what a running gateway uses.
"""
