from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRejectCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REGISTER_REJECT_UNSPECIFIED: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_UNKNOWN_TOKEN: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_DUPLICATE_CONNECTION: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_CONFIG_PAYLOAD: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_OTHER: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_WORKLOAD_IDENTITY: _ClassVar[RegisterRejectCode]
    REGISTER_REJECT_LEASE_SUPPORT: _ClassVar[RegisterRejectCode]

class RefreshOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFRESH_OUTCOME_UNSPECIFIED: _ClassVar[RefreshOutcome]
    REFRESH_APPLIED: _ClassVar[RefreshOutcome]
    REFRESH_RESTART_REQUIRED: _ClassVar[RefreshOutcome]
    REFRESH_FAILED: _ClassVar[RefreshOutcome]

class CancelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_KIND_UNSPECIFIED: _ClassVar[CancelKind]
    CANCEL_RUN: _ClassVar[CancelKind]
    TERMINATE_SESSION: _ClassVar[CancelKind]

class TunnelFrameKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TUNNEL_FRAME_KIND_UNSPECIFIED: _ClassVar[TunnelFrameKind]
    RESPONSE_START: _ClassVar[TunnelFrameKind]
    BODY: _ClassVar[TunnelFrameKind]
    END: _ClassVar[TunnelFrameKind]
    ERROR: _ClassVar[TunnelFrameKind]
    USAGE: _ClassVar[TunnelFrameKind]

class NodeCommandType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_COMMAND_UNSPECIFIED: _ClassVar[NodeCommandType]
    NODE_COMMAND_CAPABILITIES: _ClassVar[NodeCommandType]
    NODE_COMMAND_TRANSPORT_STATUS: _ClassVar[NodeCommandType]
    NODE_COMMAND_USAGE_STATUS: _ClassVar[NodeCommandType]
    NODE_COMMAND_SESSION_LIST: _ClassVar[NodeCommandType]
    NODE_COMMAND_OLLAMA_TAGS: _ClassVar[NodeCommandType]
    NODE_COMMAND_OLLAMA_PS: _ClassVar[NodeCommandType]
    NODE_COMMAND_OLLAMA_SHOW: _ClassVar[NodeCommandType]
REGISTER_REJECT_UNSPECIFIED: RegisterRejectCode
REGISTER_REJECT_UNKNOWN_TOKEN: RegisterRejectCode
REGISTER_REJECT_DUPLICATE_CONNECTION: RegisterRejectCode
REGISTER_REJECT_CONFIG_PAYLOAD: RegisterRejectCode
REGISTER_REJECT_OTHER: RegisterRejectCode
REGISTER_REJECT_WORKLOAD_IDENTITY: RegisterRejectCode
REGISTER_REJECT_LEASE_SUPPORT: RegisterRejectCode
REFRESH_OUTCOME_UNSPECIFIED: RefreshOutcome
REFRESH_APPLIED: RefreshOutcome
REFRESH_RESTART_REQUIRED: RefreshOutcome
REFRESH_FAILED: RefreshOutcome
CANCEL_KIND_UNSPECIFIED: CancelKind
CANCEL_RUN: CancelKind
TERMINATE_SESSION: CancelKind
TUNNEL_FRAME_KIND_UNSPECIFIED: TunnelFrameKind
RESPONSE_START: TunnelFrameKind
BODY: TunnelFrameKind
END: TunnelFrameKind
ERROR: TunnelFrameKind
USAGE: TunnelFrameKind
NODE_COMMAND_UNSPECIFIED: NodeCommandType
NODE_COMMAND_CAPABILITIES: NodeCommandType
NODE_COMMAND_TRANSPORT_STATUS: NodeCommandType
NODE_COMMAND_USAGE_STATUS: NodeCommandType
NODE_COMMAND_SESSION_LIST: NodeCommandType
NODE_COMMAND_OLLAMA_TAGS: NodeCommandType
NODE_COMMAND_OLLAMA_PS: NodeCommandType
NODE_COMMAND_OLLAMA_SHOW: NodeCommandType

class Envelope(_message.Message):
    __slots__ = ("register_request", "register_response", "node_ready_request", "node_ready_response", "heartbeat", "run_request", "run_event", "cancel_request", "cancel_response", "provider_tunnel_request", "provider_tunnel_frame", "node_command_request", "node_command_response", "node_config_refresh_request", "node_config_refresh_response", "node_draining")
    REGISTER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    REGISTER_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_READY_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_READY_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RUN_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RUN_EVENT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CANCEL_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_TUNNEL_REQUEST_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_TUNNEL_FRAME_FIELD_NUMBER: _ClassVar[int]
    NODE_COMMAND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_COMMAND_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_CONFIG_REFRESH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_CONFIG_REFRESH_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_DRAINING_FIELD_NUMBER: _ClassVar[int]
    register_request: RegisterRequest
    register_response: RegisterResponse
    node_ready_request: NodeReadyRequest
    node_ready_response: NodeReadyResponse
    heartbeat: Heartbeat
    run_request: RunRequest
    run_event: RunEvent
    cancel_request: CancelRequest
    cancel_response: CancelResponse
    provider_tunnel_request: ProviderTunnelRequest
    provider_tunnel_frame: ProviderTunnelFrame
    node_command_request: NodeCommandRequest
    node_command_response: NodeCommandResponse
    node_config_refresh_request: NodeConfigRefreshRequest
    node_config_refresh_response: NodeConfigRefreshResponse
    node_draining: NodeDraining
    def __init__(self, register_request: _Optional[_Union[RegisterRequest, _Mapping]] = ..., register_response: _Optional[_Union[RegisterResponse, _Mapping]] = ..., node_ready_request: _Optional[_Union[NodeReadyRequest, _Mapping]] = ..., node_ready_response: _Optional[_Union[NodeReadyResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., run_request: _Optional[_Union[RunRequest, _Mapping]] = ..., run_event: _Optional[_Union[RunEvent, _Mapping]] = ..., cancel_request: _Optional[_Union[CancelRequest, _Mapping]] = ..., cancel_response: _Optional[_Union[CancelResponse, _Mapping]] = ..., provider_tunnel_request: _Optional[_Union[ProviderTunnelRequest, _Mapping]] = ..., provider_tunnel_frame: _Optional[_Union[ProviderTunnelFrame, _Mapping]] = ..., node_command_request: _Optional[_Union[NodeCommandRequest, _Mapping]] = ..., node_command_response: _Optional[_Union[NodeCommandResponse, _Mapping]] = ..., node_config_refresh_request: _Optional[_Union[NodeConfigRefreshRequest, _Mapping]] = ..., node_config_refresh_response: _Optional[_Union[NodeConfigRefreshResponse, _Mapping]] = ..., node_draining: _Optional[_Union[NodeDraining, _Mapping]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("token", "node_version", "hostname", "lease_support")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LEASE_SUPPORT_FIELD_NUMBER: _ClassVar[int]
    token: str
    node_version: str
    hostname: str
    lease_support: LeaseSupport
    def __init__(self, token: _Optional[str] = ..., node_version: _Optional[str] = ..., hostname: _Optional[str] = ..., lease_support: _Optional[_Union[LeaseSupport, _Mapping]] = ...) -> None: ...

class LeaseSupport(_message.Message):
    __slots__ = ("recipient_key_id", "kem", "issuer_key_id")
    RECIPIENT_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KEM_FIELD_NUMBER: _ClassVar[int]
    ISSUER_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    recipient_key_id: str
    kem: str
    issuer_key_id: str
    def __init__(self, recipient_key_id: _Optional[str] = ..., kem: _Optional[str] = ..., issuer_key_id: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("accepted", "node_id", "reason", "reject_code", "config", "heartbeat_interval_ms", "heartbeat_timeout_ms", "node_draining_supported")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REJECT_CODE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_DRAINING_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    node_id: str
    reason: str
    reject_code: RegisterRejectCode
    config: NodeConfigPayload
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    node_draining_supported: bool
    def __init__(self, accepted: _Optional[bool] = ..., node_id: _Optional[str] = ..., reason: _Optional[str] = ..., reject_code: _Optional[_Union[RegisterRejectCode, str]] = ..., config: _Optional[_Union[NodeConfigPayload, _Mapping]] = ..., heartbeat_interval_ms: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ..., node_draining_supported: _Optional[bool] = ...) -> None: ...

class NodeReadyRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeReadyResponse(_message.Message):
    __slots__ = ("ready", "node_id", "reason")
    READY_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    node_id: str
    reason: str
    def __init__(self, ready: _Optional[bool] = ..., node_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeDraining(_message.Message):
    __slots__ = ("deadline_unix_ms",)
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    deadline_unix_ms: int
    def __init__(self, deadline_unix_ms: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sequence", "sent_unix_ms")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    sent_unix_ms: int
    def __init__(self, sequence: _Optional[int] = ..., sent_unix_ms: _Optional[int] = ...) -> None: ...

class NodeConfigPayload(_message.Message):
    __slots__ = ("node_id", "alias", "adapters", "runtime", "config_revision")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_REVISION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    alias: str
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterConfig]
    runtime: NodeRuntimeConfig
    config_revision: int
    def __init__(self, node_id: _Optional[str] = ..., alias: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[AdapterConfig, _Mapping]]] = ..., runtime: _Optional[_Union[NodeRuntimeConfig, _Mapping]] = ..., config_revision: _Optional[int] = ...) -> None: ...

class NodeRuntimeConfig(_message.Message):
    __slots__ = ("concurrency", "agent_kind")
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    AGENT_KIND_FIELD_NUMBER: _ClassVar[int]
    concurrency: int
    agent_kind: str
    def __init__(self, concurrency: _Optional[int] = ..., agent_kind: _Optional[str] = ...) -> None: ...

class AdapterConfig(_message.Message):
    __slots__ = ("name", "type", "enabled", "base_url", "headers", "request_timeout_ms", "idle_timeout_ms", "max_concurrency", "command", "args", "env", "workspace", "mode", "resume_args", "output_format", "prompt_placement", "context_size", "profile", "settings")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RESUME_ARGS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    enabled: bool
    base_url: str
    headers: _containers.ScalarMap[str, str]
    request_timeout_ms: int
    idle_timeout_ms: int
    max_concurrency: int
    command: str
    args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    workspace: str
    mode: str
    resume_args: _containers.RepeatedScalarFieldContainer[str]
    output_format: str
    prompt_placement: str
    context_size: int
    profile: RuntimeProfile
    settings: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., enabled: _Optional[bool] = ..., base_url: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., request_timeout_ms: _Optional[int] = ..., idle_timeout_ms: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., command: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., workspace: _Optional[str] = ..., mode: _Optional[str] = ..., resume_args: _Optional[_Iterable[str]] = ..., output_format: _Optional[str] = ..., prompt_placement: _Optional[str] = ..., context_size: _Optional[int] = ..., profile: _Optional[_Union[RuntimeProfile, _Mapping]] = ..., settings: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RuntimeProfile(_message.Message):
    __slots__ = ("name", "driver", "operations", "capabilities", "extensions", "auth_header", "auth_scheme")
    class OperationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ExtensionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bool] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    EXTENSIONS_FIELD_NUMBER: _ClassVar[int]
    AUTH_HEADER_FIELD_NUMBER: _ClassVar[int]
    AUTH_SCHEME_FIELD_NUMBER: _ClassVar[int]
    name: str
    driver: str
    operations: _containers.ScalarMap[str, str]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    extensions: _containers.ScalarMap[str, bool]
    auth_header: str
    auth_scheme: str
    def __init__(self, name: _Optional[str] = ..., driver: _Optional[str] = ..., operations: _Optional[_Mapping[str, str]] = ..., capabilities: _Optional[_Iterable[str]] = ..., extensions: _Optional[_Mapping[str, bool]] = ..., auth_header: _Optional[str] = ..., auth_scheme: _Optional[str] = ...) -> None: ...

class NodeConfigRefreshRequest(_message.Message):
    __slots__ = ("request_id", "config")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    config: NodeConfigPayload
    def __init__(self, request_id: _Optional[str] = ..., config: _Optional[_Union[NodeConfigPayload, _Mapping]] = ...) -> None: ...

class NodeConfigRefreshResponse(_message.Message):
    __slots__ = ("request_id", "outcome", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    outcome: RefreshOutcome
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., outcome: _Optional[_Union[RefreshOutcome, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("run_id", "adapter", "target", "workspace", "input", "metadata", "session_id", "background", "timeout_sec", "max_tokens", "thinking_token_budget", "collect")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SEC_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    THINKING_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    adapter: str
    target: str
    workspace: str
    input: str
    metadata: _containers.ScalarMap[str, str]
    session_id: str
    background: bool
    timeout_sec: int
    max_tokens: int
    thinking_token_budget: int
    collect: bool
    def __init__(self, run_id: _Optional[str] = ..., adapter: _Optional[str] = ..., target: _Optional[str] = ..., workspace: _Optional[str] = ..., input: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., session_id: _Optional[str] = ..., background: _Optional[bool] = ..., timeout_sec: _Optional[int] = ..., max_tokens: _Optional[int] = ..., thinking_token_budget: _Optional[int] = ..., collect: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens", "cache_write_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_input_tokens: int
    cache_write_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("run_id", "sequence", "type", "delta", "error", "usage", "metadata", "session_id", "timestamp_unix_ms")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sequence: int
    type: str
    delta: str
    error: str
    usage: Usage
    metadata: _containers.ScalarMap[str, str]
    session_id: str
    timestamp_unix_ms: int
    def __init__(self, run_id: _Optional[str] = ..., sequence: _Optional[int] = ..., type: _Optional[str] = ..., delta: _Optional[str] = ..., error: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., session_id: _Optional[str] = ..., timestamp_unix_ms: _Optional[int] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("kind", "run_id", "adapter", "target", "session_id", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: CancelKind
    run_id: str
    adapter: str
    target: str
    session_id: str
    reason: str
    def __init__(self, kind: _Optional[_Union[CancelKind, str]] = ..., run_id: _Optional[str] = ..., adapter: _Optional[str] = ..., target: _Optional[str] = ..., session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("kind", "run_id", "session_id", "ok", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: CancelKind
    run_id: str
    session_id: str
    ok: bool
    reason: str
    def __init__(self, kind: _Optional[_Union[CancelKind, str]] = ..., run_id: _Optional[str] = ..., session_id: _Optional[str] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ProviderTunnelRequest(_message.Message):
    __slots__ = ("run_id", "adapter", "target", "method", "path", "headers", "body", "stream", "timeout_sec", "metadata", "session_id", "profile", "operation", "credential_lease", "credential_binding")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SEC_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_LEASE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_BINDING_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    adapter: str
    target: str
    method: str
    path: str
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    body: bytes
    stream: bool
    timeout_sec: int
    metadata: _containers.ScalarMap[str, str]
    session_id: str
    profile: str
    operation: str
    credential_lease: bytes
    credential_binding: CredentialBinding
    def __init__(self, run_id: _Optional[str] = ..., adapter: _Optional[str] = ..., target: _Optional[str] = ..., method: _Optional[str] = ..., path: _Optional[str] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., body: _Optional[bytes] = ..., stream: _Optional[bool] = ..., timeout_sec: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., session_id: _Optional[str] = ..., profile: _Optional[str] = ..., operation: _Optional[str] = ..., credential_lease: _Optional[bytes] = ..., credential_binding: _Optional[_Union[CredentialBinding, _Mapping]] = ...) -> None: ...

class CredentialBinding(_message.Message):
    __slots__ = ("principal", "slot", "route", "profile", "target", "node_recipient", "credential_revision", "route_revision", "projection_generation", "adapter", "upstream_origin")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    NODE_RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_REVISION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_REVISION_FIELD_NUMBER: _ClassVar[int]
    PROJECTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_ORIGIN_FIELD_NUMBER: _ClassVar[int]
    principal: str
    slot: str
    route: str
    profile: str
    target: str
    node_recipient: str
    credential_revision: int
    route_revision: int
    projection_generation: int
    adapter: str
    upstream_origin: str
    def __init__(self, principal: _Optional[str] = ..., slot: _Optional[str] = ..., route: _Optional[str] = ..., profile: _Optional[str] = ..., target: _Optional[str] = ..., node_recipient: _Optional[str] = ..., credential_revision: _Optional[int] = ..., route_revision: _Optional[int] = ..., projection_generation: _Optional[int] = ..., adapter: _Optional[str] = ..., upstream_origin: _Optional[str] = ...) -> None: ...

class CredentialLeaseEnvelope(_message.Message):
    __slots__ = ("payload", "signature", "issuer_key_id")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    ISSUER_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signature: bytes
    issuer_key_id: str
    def __init__(self, payload: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., issuer_key_id: _Optional[str] = ...) -> None: ...

class CredentialLeasePayload(_message.Message):
    __slots__ = ("lease_id", "issued_at_ms", "expires_at_ms", "binding", "recipient_key_id", "kem", "sealed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    KEM_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    lease_id: bytes
    issued_at_ms: int
    expires_at_ms: int
    binding: CredentialBinding
    recipient_key_id: str
    kem: str
    sealed: bytes
    def __init__(self, lease_id: _Optional[bytes] = ..., issued_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., binding: _Optional[_Union[CredentialBinding, _Mapping]] = ..., recipient_key_id: _Optional[str] = ..., kem: _Optional[str] = ..., sealed: _Optional[bytes] = ...) -> None: ...

class ProviderTunnelFrame(_message.Message):
    __slots__ = ("run_id", "kind", "sequence", "status_code", "headers", "body", "end", "error", "usage", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    kind: TunnelFrameKind
    sequence: int
    status_code: int
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    body: bytes
    end: bool
    error: str
    usage: Usage
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, run_id: _Optional[str] = ..., kind: _Optional[_Union[TunnelFrameKind, str]] = ..., sequence: _Optional[int] = ..., status_code: _Optional[int] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., body: _Optional[bytes] = ..., end: _Optional[bool] = ..., error: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NodeCommandRequest(_message.Message):
    __slots__ = ("request_id", "type", "adapter", "target", "arguments")
    class ArgumentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    type: NodeCommandType
    adapter: str
    target: str
    arguments: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., type: _Optional[_Union[NodeCommandType, str]] = ..., adapter: _Optional[str] = ..., target: _Optional[str] = ..., arguments: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NodeCommandResponse(_message.Message):
    __slots__ = ("request_id", "type", "ok", "error", "result_json")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    type: NodeCommandType
    ok: bool
    error: str
    result_json: str
    def __init__(self, request_id: _Optional[str] = ..., type: _Optional[_Union[NodeCommandType, str]] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...
