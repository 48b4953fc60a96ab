"""TLS for the listeners: Twisted's ``CertificateOptions`` built from the [tls] section, reloadable.

Every TLS listener (STOMP, MQTT, WebSocket, admin HTTPS) gets a
``ServerTls.creator(mode)``: an ``IOpenSSLServerConnectionCreator`` whose
connections come from the options current when the client connects.  So
``reload()`` (SIGHUP) makes new connections use a renewed certificate, key
or CA while connections already open keep the context they shook hands with.
A reload that fails (a missing file, a key that does not match) changes
nothing: the old certificate stays in use and the error says why.

TLS 1.2 is the oldest version offered (``min_version = "1.3"`` raises it).
Client certificates, per listener: ``required`` (a connection without one
from ``ca`` fails in the handshake), ``optional`` (asked for; one that is
given must verify against ``ca``) or ``off`` (not asked for).  The CN of the
verified certificate is what ``protocols.adapter.peer_certificate_user``
reads for the sessions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator, IProtocolFactory
from twisted.internet.ssl import CertificateOptions, TLSVersion
from twisted.logger import Logger
from twisted.protocols.tls import BufferingTLSTransport, TLSMemoryBIOFactory
from zope.interface import implementer

from gateway.twisted_types import connected_transport

if TYPE_CHECKING:
    from OpenSSL.SSL import _NoOverlappingProtocols  # the type of SSL.NO_OVERLAPPING_PROTOCOLS

log = Logger(namespace="gateway.tls")

CLIENT_CERT_MODES = ("required", "optional", "off")
MIN_VERSIONS = {"1.2": TLSVersion.TLSv1_2, "1.3": TLSVersion.TLSv1_3}


class TlsError(ValueError):
    """The certificate, key or CA cannot be used; the text names the file and why."""


@dataclass(frozen=True)
class TlsFiles:
    """Where the PEM files are, and what the handshake demands."""

    cert: str
    key: str
    ca: str = ""
    min_version: str = "1.2"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"cannot read the TLS {what} {path}: {exc.strerror}") from None


def _certificates(path: str, what: str) -> list[x509.Certificate]:
    data = _read(path, what)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TlsError(f"the TLS {what} {path} is not PEM certificates: {exc}") from None


def _private_key(path: str) -> PrivateKeyTypes:
    data = _read(path, "key")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TlsError(f"the TLS key {path} is encrypted; give the key without a passphrase") from None
    except ValueError as exc:
        raise TlsError(f"the TLS key {path} is not a PEM private key: {exc}") from None


def certificate_options(files: TlsFiles, client_certs: str) -> CertificateOptions:
    """Options for one client-certificate mode, their context built now so that errors show here."""
    if client_certs not in CLIENT_CERT_MODES:
        raise TlsError(f"client_certs must be one of {', '.join(CLIENT_CERT_MODES)}, got {client_certs!r}")
    chain = _certificates(files.cert, "certificate")
    key = _private_key(files.key)
    authorities = _certificates(files.ca, "CA") if files.ca and client_certs != "off" else []
    if client_certs == "required" and not authorities:
        raise TlsError("client_certs = \"required\" needs [tls] ca: the authority that signs client certificates")
    # pyOpenSSL deprecates its own X509 and PKey objects where a context takes a certificate
    # or key, but Twisted declares them; its CA store still needs X509 objects.
    options = CertificateOptions(
        privateKey=cast(crypto.PKey, key), certificate=cast(crypto.X509, chain[0]),
        extraCertChain=cast(list[crypto.X509], chain[1:]),
        verify=bool(authorities), caCerts=[crypto.X509.from_cryptography(a) for a in authorities] or None,
        requireCertificate=client_certs == "required",
        raiseMinimumTo=MIN_VERSIONS[files.min_version],
    )
    try:
        context = options.getContext()
    except SSL.Error as exc:
        raise TlsError(f"the TLS key {files.key} does not fit the certificate {files.cert}: {exc}") from None
    for authority in authorities:
        # Named in the handshake, so that a client holding several certificates picks one of ours.
        context.add_client_ca(authority)
    context.set_alpn_select_callback(_select_protocol)
    return options


def _select_protocol(connection: SSL.Connection, offered: list[bytes]) -> bytes | _NoOverlappingProtocols:
    """ALPN: the listener's own protocol when the client offers it (h2 or http/1.1 on the admin
    listener), else none, and the handshake goes on.

    Twisted's callback answers b"" when nothing overlaps, which aborts the handshake
    with an internal_error alert: every browser (wss offers http/1.1) and any client
    offering an ALPN name was refused on the STOMP, MQTT and WebSocket listeners.
    """
    tls_protocol = connection.get_app_data()
    wrapped = getattr(getattr(tls_protocol, "factory", None), "wrappedFactory", None)
    acceptable = getattr(wrapped, "acceptableProtocols", None)  # IProtocolNegotiationFactory
    for name in acceptable() if callable(acceptable) else ():
        if name in offered:
            return bytes(name)
    return SSL.NO_OVERLAPPING_PROTOCOLS


@implementer(IOpenSSLServerConnectionCreator)
class _Creator:
    """What a TLS listener holds: each new connection takes its mode's current options."""

    def __init__(self, owner: ServerTls, mode: str) -> None:
        self._owner = owner
        self._mode = mode

    def serverConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        return SSL.Connection(self._owner.options(self._mode).getContext(), None)


class _ClosingTLSTransport(BufferingTLSTransport):
    """Twisted's TLS transport, but the socket closes once the broker's close_notify is out.

    Twisted waits for the client's close_notify before closing the socket.
    Many clients send none, or only once they see the socket close: stomp.py's
    reader sleeps in select() while OpenSSL already holds the alert, so its
    DISCONNECT never returned, and the broker kept the socket of every such
    client.  The side that closes need not wait for the answer (RFC 8446 6.1):
    whatever path sends the close_notify (a close, a reply to the client's)
    closes TCP too, once what was written has gone.
    """

    def _shutdownTLS(self) -> None:
        super()._shutdownTLS()
        if self.transport is not None:
            connected_transport(self.transport).loseConnection()


class TlsListenerFactory(TLSMemoryBIOFactory):
    """What ``listenSSL`` puts in front of a listener's factory, with the closing described above."""

    protocol = _ClosingTLSTransport


def tls_factory(creator: IOpenSSLServerConnectionCreator, factory: object) -> TlsListenerFactory:
    """``factory`` (STOMP, MQTT, WebSocket or the admin site) behind TLS: give it to ``listenTCP``."""
    return TlsListenerFactory(creator, False, cast(IProtocolFactory, factory))


class ServerTls:
    """The [tls] material for every TLS listener: built at start, rebuilt by ``reload``."""

    def __init__(self, files: TlsFiles, modes: set[str]) -> None:
        """``modes``: the client-certificate modes the listeners use (each gets its own context)."""
        self.files = files
        self._modes = set(modes)
        self._options = self._load()

    def _load(self) -> dict[str, CertificateOptions]:
        return {mode: certificate_options(self.files, mode) for mode in sorted(self._modes)}

    def options(self, mode: str) -> CertificateOptions:
        return self._options[mode]

    def creator(self, mode: str) -> IOpenSSLServerConnectionCreator:
        """The connection creator to give ``listenSSL`` for a listener in client-certificate ``mode``."""
        if mode not in self._options:
            self._modes.add(mode)
            self._options[mode] = certificate_options(self.files, mode)
        # @implementer says so to zope; mypy without the mypy-zope plugin needs the cast.
        return cast(IOpenSSLServerConnectionCreator, _Creator(self, mode))

    def reload(self) -> None:
        """Read the certificate, key and CA again: new connections use them, open ones keep theirs.

        Raises ``TlsError`` (and keeps the old material) when the new files cannot be used.
        """
        self._options = self._load()
        log.info("TLS certificate {cert} reloaded", cert=self.files.cert)
