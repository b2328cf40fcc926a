from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(_message.Message):
    __slots__ = ["kv", "type"]
    class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    DELETE: Event.EventType
    KV_FIELD_NUMBER: _ClassVar[int]
    PUT: Event.EventType
    TYPE_FIELD_NUMBER: _ClassVar[int]
    kv: KeyValue
    type: Event.EventType
    def __init__(self, type: _Optional[_Union[Event.EventType, str]] = ..., kv: _Optional[_Union[KeyValue, _Mapping]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ["create_revision", "key", "lease", "mod_revision", "value", "version"]
    CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    create_revision: int
    key: bytes
    lease: int
    mod_revision: int
    value: bytes
    version: int
    def __init__(self, key: _Optional[bytes] = ..., create_revision: _Optional[int] = ..., mod_revision: _Optional[int] = ..., version: _Optional[int] = ..., value: _Optional[bytes] = ..., lease: _Optional[int] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ["key", "lease", "value"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    lease: int
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., lease: _Optional[int] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ["header"]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ...) -> None: ...

class ResponseHeader(_message.Message):
    __slots__ = ["cluster_id", "member_id", "raft_term", "revision"]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    cluster_id: int
    member_id: int
    raft_term: int
    revision: int
    def __init__(self, cluster_id: _Optional[int] = ..., member_id: _Optional[int] = ..., revision: _Optional[int] = ..., raft_term: _Optional[int] = ...) -> None: ...

class WatchCreateRequest(_message.Message):
    __slots__ = ["fragment", "key", "range_end", "start_revision"]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RANGE_END_FIELD_NUMBER: _ClassVar[int]
    START_REVISION_FIELD_NUMBER: _ClassVar[int]
    fragment: bool
    key: bytes
    range_end: bytes
    start_revision: int
    def __init__(self, key: _Optional[bytes] = ..., range_end: _Optional[bytes] = ..., start_revision: _Optional[int] = ..., fragment: bool = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["create_request"]
    CREATE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    create_request: WatchCreateRequest
    def __init__(self, create_request: _Optional[_Union[WatchCreateRequest, _Mapping]] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ["cancel_reason", "canceled", "compact_revision", "created", "events", "fragment", "header", "watch_id"]
    CANCELED_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REASON_FIELD_NUMBER: _ClassVar[int]
    COMPACT_REVISION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WATCH_ID_FIELD_NUMBER: _ClassVar[int]
    cancel_reason: str
    canceled: bool
    compact_revision: int
    created: bool
    events: _containers.RepeatedCompositeFieldContainer[Event]
    fragment: bool
    header: ResponseHeader
    watch_id: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., watch_id: _Optional[int] = ..., created: bool = ..., canceled: bool = ..., compact_revision: _Optional[int] = ..., cancel_reason: _Optional[str] = ..., fragment: bool = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...
