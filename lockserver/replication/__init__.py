"""Replication: a replicated group of servers over etcd.

It owns the etcd client (``_etcd``, over etcd's gRPC API or its HTTP/JSON gateway:
``_etcd_grpc`` / ``_etcd_http`` the transports, ``_etcd_json`` the vocabulary,
``_etcd_messages`` the gRPC messages as that vocabulary's JSON, ``_etcd_grpc_watch`` /
``_etcd_watch`` the watch streams, ``_etcd_access`` how a replica reaches etcd from the
settings), the group's state machine and log entries (``_group``), the
group secret (``_groupauth``) and the replica that proposes and applies the log (``_replica``:
``Replica``, ``ReplicatedDoor``).

May import: the standard library, trio, h11, attrs, msgpack, ``protocol``,
``lockserver.engine`` (the door it replicates) and the foundations at the top of
``lockserver`` (auth, build, the peer as the door's owner). Never the HTTP face or the shell
(tests/test_layering.py).
"""

from ._etcd_access import etcd_client as etcd_client
from ._etcd_access import etcd_endpoints as etcd_endpoints
from ._etcd_json import EtcdError as EtcdError
from ._group import Genesis as Genesis
from ._groupauth import read_group_secret as read_group_secret
from ._replica import GroupRefused as GroupRefused
from ._replica import Replica as Replica
from ._replica import ReplicatedDoor as ReplicatedDoor
from ._replica import ReplicationSettings as ReplicationSettings

__all__ = [
    "EtcdError",
    "Genesis",
    "GroupRefused",
    "Replica",
    "ReplicatedDoor",
    "ReplicationSettings",
    "etcd_client",
    "etcd_endpoints",
    "read_group_secret",
]
