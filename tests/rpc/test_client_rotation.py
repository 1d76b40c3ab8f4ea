"""Rotated credentials: a client rebuilds its channels when the files change on disk."""

from __future__ import annotations

import grpc

from synapse_ha.client.cluster import ClusterClient


class Channels:
    """A channel factory that records what it made (plaintext channels, never dialled)."""

    def __init__(self) -> None:
        self.made: list[grpc.Channel] = []

    def __call__(self, address: str) -> grpc.Channel:
        channel = grpc.insecure_channel(address)
        self.made.append(channel)
        return channel


def test_channels_are_rebuilt_once_the_credentials_change() -> None:
    channels = Channels()
    version = ["v1"]
    client = ClusterClient(
        ["127.0.0.1:1"], channel_factory=channels, credentials_version=lambda: version[0]
    )
    client.credentials_check_s = 0.0
    try:
        first = client.channel("127.0.0.1:1")
        assert client.channel("127.0.0.1:1") is first  # unchanged files: reused
        version[0] = "v2"
        second = client.channel("127.0.0.1:1")
        assert second is not first
        assert len(channels.made) == 2
        assert client.channel("127.0.0.1:1") is second
    finally:
        client.close()


def test_without_a_version_channels_live_until_closed() -> None:
    channels = Channels()
    client = ClusterClient(["127.0.0.1:1"], channel_factory=channels)
    client.credentials_check_s = 0.0
    try:
        assert client.channel("127.0.0.1:1") is client.channel("127.0.0.1:1")
        assert len(channels.made) == 1
    finally:
        client.close()
