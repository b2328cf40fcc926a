"""The lockserver wire protocol: length-prefixed msgpack frames, messages and the transaction
tree vocabulary. Pure and sans-I/O (no sockets, no clock). See PROTOCOL.md."""

from ._codec import new_transaction_result as new_transaction_result
from ._codec import pack as pack
from ._codec import request_from_wire as request_from_wire
from ._codec import request_to_wire as request_to_wire
from ._codec import server_message_from_wire as server_message_from_wire
from ._codec import server_message_to_wire as server_message_to_wire
from ._codec import unpack as unpack
from ._connection import Connection as Connection
from ._encode import encode_execute as encode_execute
from ._errors import ErrorCode as ErrorCode
from ._errors import ProtocolError as ProtocolError
from ._framing import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from ._framing import HEADER_SIZE as HEADER_SIZE
from ._framing import MAX_HELLO_FRAME as MAX_HELLO_FRAME
from ._framing import FrameBuffer as FrameBuffer
from ._framing import frame as frame
from ._inspect import DEFAULT_PAGE as DEFAULT_PAGE
from ._inspect import MAX_CURSOR as MAX_CURSOR
from ._inspect import MAX_HOLDERS as MAX_HOLDERS
from ._inspect import MAX_PAGE as MAX_PAGE
from ._inspect import PAGE_BYTES as PAGE_BYTES
from ._inspect import PAGE_SCAN as PAGE_SCAN
from ._inspect import FeedEvent as FeedEvent
from ._inspect import FeedKind as FeedKind
from ._inspect import ForceRelease as ForceRelease
from ._inspect import HolderInfo as HolderInfo
from ._inspect import HoldersPage as HoldersPage
from ._inspect import ListHolders as ListHolders
from ._inspect import ListQuery as ListQuery
from ._inspect import ListSessions as ListSessions
from ._inspect import ListWaiters as ListWaiters
from ._inspect import Released as Released
from ._inspect import SessionInfo as SessionInfo
from ._inspect import SessionsPage as SessionsPage
from ._inspect import Subscribe as Subscribe
from ._inspect import Subscribed as Subscribed
from ._inspect import Unsubscribe as Unsubscribe
from ._inspect import Unsubscribed as Unsubscribed
from ._inspect import WaiterInfo as WaiterInfo
from ._inspect import WaitersPage as WaitersPage
from ._inspect import make_holder as make_holder
from ._json import iso_utc as iso_utc
from ._json import json_value as json_value
from ._json import record_to_json as record_to_json
from ._lifecycle import CLOSING_ERROR as CLOSING_ERROR
from ._lifecycle import LIFECYCLE as LIFECYCLE
from ._lifecycle import Lifecycle as Lifecycle
from ._lifecycle import LifecycleError as LifecycleError
from ._lifecycle import Role as Role
from ._lifecycle import State as State
from ._lifecycle import message_kind as message_kind
from ._messages import DEFAULT_SESSION_MAX_AGE as DEFAULT_SESSION_MAX_AGE
from ._messages import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._messages import Cancel as Cancel
from ._messages import Cancelled as Cancelled
from ._messages import Cause as Cause
from ._messages import EndSession as EndSession
from ._messages import ErrorReply as ErrorReply
from ._messages import Event as Event
from ._messages import Execute as Execute
from ._messages import GetStatistics as GetStatistics
from ._messages import Hello as Hello
from ._messages import LockLost as LockLost
from ._messages import LostReason as LostReason
from ._messages import Ping as Ping
from ._messages import Pong as Pong
from ._messages import Reply as Reply
from ._messages import ReplyBody as ReplyBody
from ._messages import Request as Request
from ._messages import ServerMessage as ServerMessage
from ._messages import SessionEnded as SessionEnded
from ._messages import SessionSpec as SessionSpec
from ._messages import Statistics as Statistics
from ._messages import Status as Status
from ._messages import Transaction as Transaction
from ._messages import TransactionResult as TransactionResult
from ._messages import Welcome as Welcome
from ._ops import ELEMENT_SIZE as ELEMENT_SIZE
from ._ops import FALSE as FALSE
from ._ops import MIN_SECONDS as MIN_SECONDS
from ._ops import TRUE as TRUE
from ._ops import Abort as Abort
from ._ops import And as And
from ._ops import AnywayContinueAfter as AnywayContinueAfter
from ._ops import ArrivedBelow as ArrivedBelow
from ._ops import Assert as Assert
from ._ops import Block as Block
from ._ops import ChangeOperator as ChangeOperator
from ._ops import CountBelow as CountBelow
from ._ops import DeleteVar as DeleteVar
from ._ops import Exists as Exists
from ._ops import FalseOp as FalseOp
from ._ops import If as If
from ._ops import Node as Node
from ._ops import Not as Not
from ._ops import Operator as Operator
from ._ops import Or as Or
from ._ops import SelectConstantValue as SelectConstantValue
from ._ops import SelectOperatorValue as SelectOperatorValue
from ._ops import SelectVarValue as SelectVarValue
from ._ops import SetVar as SetVar
from ._ops import Statement as Statement
from ._ops import TrueOp as TrueOp
from ._ops import Waiting as Waiting
from ._ops import Xor as Xor
from ._ops import check_value as check_value
from ._ops import value_size as value_size
from ._trees import DEFAULT_TREE_LIMITS as DEFAULT_TREE_LIMITS
from ._trees import TreeLimits as TreeLimits
from ._trees import node_from_wire as node_from_wire
from ._trees import node_to_wire as node_to_wire
from ._trees import statements_from_wire as statements_from_wire

__all__ = [
    # framing and connection
    "DEFAULT_MAX_FRAME",
    "MAX_HELLO_FRAME",
    "HEADER_SIZE",
    "FrameBuffer",
    "frame",
    "Connection",
    "Role",
    # JSON rendering of the records
    "iso_utc",
    "json_value",
    "record_to_json",
    # lifecycle
    "State",
    "Lifecycle",
    "LifecycleError",
    "LIFECYCLE",
    "CLOSING_ERROR",
    "message_kind",
    # errors
    "ErrorCode",
    "ProtocolError",
    # codec
    "DEFAULT_TREE_LIMITS",
    "TreeLimits",
    "pack",
    "unpack",
    "node_to_wire",
    "node_from_wire",
    "statements_from_wire",
    "request_to_wire",
    "encode_execute",
    "request_from_wire",
    "server_message_to_wire",
    "server_message_from_wire",
    "new_transaction_result",
    # messages
    "PROTOCOL_VERSION",
    "DEFAULT_SESSION_MAX_AGE",
    "Status",
    "Cause",
    "LostReason",
    "SessionSpec",
    "Transaction",
    "Hello",
    "Execute",
    "EndSession",
    "GetStatistics",
    "Ping",
    "Cancel",
    "Request",
    "Welcome",
    "TransactionResult",
    "SessionEnded",
    "Statistics",
    "Pong",
    "Cancelled",
    "ReplyBody",
    "Reply",
    "ErrorReply",
    "LockLost",
    "Event",
    "ServerMessage",
    # inspection and operations (PROTOCOL.md "Inspection")
    "DEFAULT_PAGE",
    "MAX_CURSOR",
    "MAX_HOLDERS",
    "MAX_PAGE",
    "PAGE_BYTES",
    "PAGE_SCAN",
    "FeedEvent",
    "FeedKind",
    "ForceRelease",
    "HolderInfo",
    "HoldersPage",
    "ListHolders",
    "ListQuery",
    "ListSessions",
    "ListWaiters",
    "Released",
    "SessionInfo",
    "SessionsPage",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "WaiterInfo",
    "WaitersPage",
    "make_holder",
    # tree
    "Node",
    "Operator",
    "ChangeOperator",
    "Statement",
    "Assert",
    "Abort",
    "Block",
    "If",
    "AnywayContinueAfter",
    "SelectConstantValue",
    "SelectOperatorValue",
    "SelectVarValue",
    "And",
    "Or",
    "Xor",
    "Not",
    "TrueOp",
    "FalseOp",
    "TRUE",
    "FALSE",
    "Exists",
    "CountBelow",
    "Waiting",
    "ArrivedBelow",
    "SetVar",
    "DeleteVar",
    "check_value",
    "value_size",
    "ELEMENT_SIZE",
    "MIN_SECONDS",
]
