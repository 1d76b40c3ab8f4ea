from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_SCHEDULED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class AttemptState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_STATE_UNSPECIFIED: _ClassVar[AttemptState]
    ATTEMPT_STATE_BOUND: _ClassVar[AttemptState]
    ATTEMPT_STATE_RUNNING: _ClassVar[AttemptState]
    ATTEMPT_STATE_SUCCEEDED: _ClassVar[AttemptState]
    ATTEMPT_STATE_FAILED: _ClassVar[AttemptState]
    ATTEMPT_STATE_REQUEUED: _ClassVar[AttemptState]
    ATTEMPT_STATE_STOPPED: _ClassVar[AttemptState]

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_BOUND: _ClassVar[MemberState]
    MEMBER_STATE_RUNNING: _ClassVar[MemberState]
    MEMBER_STATE_EXITED: _ClassVar[MemberState]

class NodeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATUS_UNSPECIFIED: _ClassVar[NodeStatus]
    NODE_STATUS_READY: _ClassVar[NodeStatus]
    NODE_STATUS_CORDONED: _ClassVar[NodeStatus]
    NODE_STATUS_DRAINING: _ClassVar[NodeStatus]
    NODE_STATUS_DEAD: _ClassVar[NodeStatus]

class ReplicaRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_ROLE_UNSPECIFIED: _ClassVar[ReplicaRole]
    REPLICA_ROLE_LEADER: _ClassVar[ReplicaRole]
    REPLICA_ROLE_FOLLOWER: _ClassVar[ReplicaRole]
    REPLICA_ROLE_CANDIDATE: _ClassVar[ReplicaRole]
    REPLICA_ROLE_UNREACHABLE: _ClassVar[ReplicaRole]

class UserRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USER_ROLE_UNSPECIFIED: _ClassVar[UserRole]
    USER_ROLE_ADMIN: _ClassVar[UserRole]
    USER_ROLE_OPERATOR: _ClassVar[UserRole]
    USER_ROLE_USER: _ClassVar[UserRole]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_SCHEDULED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
ATTEMPT_STATE_UNSPECIFIED: AttemptState
ATTEMPT_STATE_BOUND: AttemptState
ATTEMPT_STATE_RUNNING: AttemptState
ATTEMPT_STATE_SUCCEEDED: AttemptState
ATTEMPT_STATE_FAILED: AttemptState
ATTEMPT_STATE_REQUEUED: AttemptState
ATTEMPT_STATE_STOPPED: AttemptState
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_BOUND: MemberState
MEMBER_STATE_RUNNING: MemberState
MEMBER_STATE_EXITED: MemberState
NODE_STATUS_UNSPECIFIED: NodeStatus
NODE_STATUS_READY: NodeStatus
NODE_STATUS_CORDONED: NodeStatus
NODE_STATUS_DRAINING: NodeStatus
NODE_STATUS_DEAD: NodeStatus
REPLICA_ROLE_UNSPECIFIED: ReplicaRole
REPLICA_ROLE_LEADER: ReplicaRole
REPLICA_ROLE_FOLLOWER: ReplicaRole
REPLICA_ROLE_CANDIDATE: ReplicaRole
REPLICA_ROLE_UNREACHABLE: ReplicaRole
USER_ROLE_UNSPECIFIED: UserRole
USER_ROLE_ADMIN: UserRole
USER_ROLE_OPERATOR: UserRole
USER_ROLE_USER: UserRole

class Resources(_message.Message):
    __slots__ = ("cpu_milli", "memory_mib", "gpu")
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    cpu_milli: int
    memory_mib: int
    gpu: int
    def __init__(self, cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., gpu: _Optional[int] = ...) -> None: ...

class TopologyLabel(_message.Message):
    __slots__ = ("level", "value")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    level: str
    value: str
    def __init__(self, level: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class EnvVar(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max", "backoff_ms", "max_backoff_ms")
    MAX_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    max: int
    backoff_ms: int
    max_backoff_ms: int
    def __init__(self, max: _Optional[int] = ..., backoff_ms: _Optional[int] = ..., max_backoff_ms: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "replicas", "resources", "shell_command", "argv", "env", "workdir", "priority", "topology_required", "topology_preferred", "time_limit_ms", "retries", "image", "queue", "priority_class", "prestart", "progress", "dependencies", "begin_at_ms", "begin_delay_ms", "deadline_at_ms", "deadline_delay_ms", "array", "wait_for_nodes", "stop_grace_ms", "account", "nodes", "replace", "elastic")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SHELL_COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_PREFERRED_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRESTART_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    BEGIN_AT_MS_FIELD_NUMBER: _ClassVar[int]
    BEGIN_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_NODES_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    name: str
    replicas: int
    resources: Resources
    shell_command: str
    argv: CommandArgs
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    workdir: str
    priority: int
    topology_required: str
    topology_preferred: str
    time_limit_ms: int
    retries: RetryPolicy
    image: str
    queue: str
    priority_class: str
    prestart: Prestart
    progress: Progress
    dependencies: Dependencies
    begin_at_ms: int
    begin_delay_ms: int
    deadline_at_ms: int
    deadline_delay_ms: int
    array: str
    wait_for_nodes: bool
    stop_grace_ms: int
    account: str
    nodes: NodeSelector
    replace: ReplacePolicy
    elastic: ElasticPolicy
    def __init__(self, name: _Optional[str] = ..., replicas: _Optional[int] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., shell_command: _Optional[str] = ..., argv: _Optional[_Union[CommandArgs, _Mapping]] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., workdir: _Optional[str] = ..., priority: _Optional[int] = ..., topology_required: _Optional[str] = ..., topology_preferred: _Optional[str] = ..., time_limit_ms: _Optional[int] = ..., retries: _Optional[_Union[RetryPolicy, _Mapping]] = ..., image: _Optional[str] = ..., queue: _Optional[str] = ..., priority_class: _Optional[str] = ..., prestart: _Optional[_Union[Prestart, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., dependencies: _Optional[_Union[Dependencies, _Mapping]] = ..., begin_at_ms: _Optional[int] = ..., begin_delay_ms: _Optional[int] = ..., deadline_at_ms: _Optional[int] = ..., deadline_delay_ms: _Optional[int] = ..., array: _Optional[str] = ..., wait_for_nodes: _Optional[bool] = ..., stop_grace_ms: _Optional[int] = ..., account: _Optional[str] = ..., nodes: _Optional[_Union[NodeSelector, _Mapping]] = ..., replace: _Optional[_Union[ReplacePolicy, _Mapping]] = ..., elastic: _Optional[_Union[ElasticPolicy, _Mapping]] = ...) -> None: ...

class ElasticPolicy(_message.Message):
    __slots__ = ("min_replicas", "signal")
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    min_replicas: int
    signal: str
    def __init__(self, min_replicas: _Optional[int] = ..., signal: _Optional[str] = ...) -> None: ...

class ReplacePolicy(_message.Message):
    __slots__ = ("timeout_ms", "signal")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    signal: str
    def __init__(self, timeout_ms: _Optional[int] = ..., signal: _Optional[str] = ...) -> None: ...

class NodeSelector(_message.Message):
    __slots__ = ("features", "gpu_model", "names", "exclude")
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    features: str
    gpu_model: str
    names: _containers.RepeatedScalarFieldContainer[str]
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, features: _Optional[str] = ..., gpu_model: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class Dependencies(_message.Message):
    __slots__ = ("after_ok", "after_any", "after_not_ok", "after", "singleton")
    AFTER_OK_FIELD_NUMBER: _ClassVar[int]
    AFTER_ANY_FIELD_NUMBER: _ClassVar[int]
    AFTER_NOT_OK_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SINGLETON_FIELD_NUMBER: _ClassVar[int]
    after_ok: _containers.RepeatedScalarFieldContainer[str]
    after_any: _containers.RepeatedScalarFieldContainer[str]
    after_not_ok: _containers.RepeatedScalarFieldContainer[str]
    after: _containers.RepeatedScalarFieldContainer[str]
    singleton: bool
    def __init__(self, after_ok: _Optional[_Iterable[str]] = ..., after_any: _Optional[_Iterable[str]] = ..., after_not_ok: _Optional[_Iterable[str]] = ..., after: _Optional[_Iterable[str]] = ..., singleton: _Optional[bool] = ...) -> None: ...

class Prestart(_message.Message):
    __slots__ = ("command", "shell", "timeout_ms")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    shell: bool
    timeout_ms: int
    def __init__(self, command: _Optional[_Iterable[str]] = ..., shell: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("timeout_ms", "source")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    source: str
    def __init__(self, timeout_ms: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class CommandArgs(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("at_ms", "step")
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    at_ms: int
    step: int
    def __init__(self, at_ms: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("rank", "node_id", "gpus", "state", "has_exit_code", "exit_code", "member_state", "checkpoint", "generation", "lost")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_STATE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node_id: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    state: str
    has_exit_code: bool
    exit_code: int
    member_state: MemberState
    checkpoint: Checkpoint
    generation: int
    lost: bool
    def __init__(self, rank: _Optional[int] = ..., node_id: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., member_state: _Optional[_Union[MemberState, str]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., generation: _Optional[int] = ..., lost: _Optional[bool] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("number", "fencing_token", "master_port", "bound_at_ms", "started_at_ms", "ended_at_ms", "outcome", "members", "preempted_by", "preemption", "preempt_deadline_ms", "checkpoint")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    BOUND_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    number: int
    fencing_token: int
    master_port: int
    bound_at_ms: int
    started_at_ms: int
    ended_at_ms: int
    outcome: str
    members: _containers.RepeatedCompositeFieldContainer[Member]
    preempted_by: str
    preemption: str
    preempt_deadline_ms: int
    checkpoint: Checkpoint
    def __init__(self, number: _Optional[int] = ..., fencing_token: _Optional[int] = ..., master_port: _Optional[int] = ..., bound_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., preempted_by: _Optional[str] = ..., preemption: _Optional[str] = ..., preempt_deadline_ms: _Optional[int] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "request_id", "spec", "state", "reason", "submitted_at_ms", "finished_at_ms", "attempts_made", "retry_not_before_ms", "attempt", "seq", "reason_code", "retries_used", "requeues", "owner", "redacted", "cancelled_by", "job_state", "waiting_for", "array_id", "array_index", "resume_step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_MADE_FIELD_NUMBER: _ClassVar[int]
    RETRY_NOT_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    REQUEUES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_BY_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    spec: JobSpec
    state: str
    reason: str
    submitted_at_ms: int
    finished_at_ms: int
    attempts_made: int
    retry_not_before_ms: int
    attempt: Attempt
    seq: int
    reason_code: str
    retries_used: int
    requeues: int
    owner: str
    redacted: bool
    cancelled_by: str
    job_state: JobState
    waiting_for: Dependencies
    array_id: str
    array_index: int
    resume_step: int
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., submitted_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., attempts_made: _Optional[int] = ..., retry_not_before_ms: _Optional[int] = ..., attempt: _Optional[_Union[Attempt, _Mapping]] = ..., seq: _Optional[int] = ..., reason_code: _Optional[str] = ..., retries_used: _Optional[int] = ..., requeues: _Optional[int] = ..., owner: _Optional[str] = ..., redacted: _Optional[bool] = ..., cancelled_by: _Optional[str] = ..., job_state: _Optional[_Union[JobState, str]] = ..., waiting_for: _Optional[_Union[Dependencies, _Mapping]] = ..., array_id: _Optional[str] = ..., array_index: _Optional[int] = ..., resume_step: _Optional[int] = ...) -> None: ...

class ArraySummary(_message.Message):
    __slots__ = ("array_id", "spec", "owner", "submitted_at_ms", "seq", "tasks", "throttle", "task_states", "redacted", "request_id")
    class TaskStatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    TASK_STATES_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    array_id: str
    spec: JobSpec
    owner: str
    submitted_at_ms: int
    seq: int
    tasks: int
    throttle: int
    task_states: _containers.ScalarMap[str, int]
    redacted: bool
    request_id: str
    def __init__(self, array_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., owner: _Optional[str] = ..., submitted_at_ms: _Optional[int] = ..., seq: _Optional[int] = ..., tasks: _Optional[int] = ..., throttle: _Optional[int] = ..., task_states: _Optional[_Mapping[str, int]] = ..., redacted: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "created")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    created: bool
    def __init__(self, job_id: _Optional[str] = ..., created: _Optional[bool] = ...) -> None: ...

class SubmitJobsRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[SubmitJobRequest]
    def __init__(self, jobs: _Optional[_Iterable[_Union[SubmitJobRequest, _Mapping]]] = ...) -> None: ...

class SubmitJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[SubmitJobResponse]
    def __init__(self, jobs: _Optional[_Iterable[_Union[SubmitJobResponse, _Mapping]]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "allow_stale")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    allow_stale: bool
    def __init__(self, job_id: _Optional[str] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job", "stale")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    job: Job
    stale: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., stale: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "name", "node_id", "limit", "allow_stale", "page_token", "job_states", "collapse_arrays", "array_id")
    STATES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOB_STATES_FIELD_NUMBER: _ClassVar[int]
    COLLAPSE_ARRAYS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[str]
    name: str
    node_id: str
    limit: int
    allow_stale: bool
    page_token: str
    job_states: _containers.RepeatedScalarFieldContainer[JobState]
    collapse_arrays: bool
    array_id: str
    def __init__(self, states: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., node_id: _Optional[str] = ..., limit: _Optional[int] = ..., allow_stale: _Optional[bool] = ..., page_token: _Optional[str] = ..., job_states: _Optional[_Iterable[_Union[JobState, str]]] = ..., collapse_arrays: _Optional[bool] = ..., array_id: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "stale", "next_page_token", "arrays")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ARRAYS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    stale: bool
    next_page_token: str
    arrays: _containers.RepeatedCompositeFieldContainer[ArraySummary]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., stale: _Optional[bool] = ..., next_page_token: _Optional[str] = ..., arrays: _Optional[_Iterable[_Union[ArraySummary, _Mapping]]] = ...) -> None: ...

class GetArrayRequest(_message.Message):
    __slots__ = ("array_id", "allow_stale")
    ARRAY_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    array_id: str
    allow_stale: bool
    def __init__(self, array_id: _Optional[str] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class GetArrayResponse(_message.Message):
    __slots__ = ("array", "stale")
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    array: ArraySummary
    stale: bool
    def __init__(self, array: _Optional[_Union[ArraySummary, _Mapping]] = ..., stale: _Optional[bool] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("state", "message", "job_state")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    message: str
    job_state: JobState
    def __init__(self, state: _Optional[str] = ..., message: _Optional[str] = ..., job_state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class RequeueJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RequeueJobResponse(_message.Message):
    __slots__ = ("state", "message", "job_state")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    message: str
    job_state: JobState
    def __init__(self, state: _Optional[str] = ..., message: _Optional[str] = ..., job_state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("job_id", "allow_stale")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    allow_stale: bool
    def __init__(self, job_id: _Optional[str] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("job_id", "state", "explanation", "stale", "reason_code", "job_state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    explanation: str
    stale: bool
    reason_code: str
    job_state: JobState
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ..., explanation: _Optional[str] = ..., stale: _Optional[bool] = ..., reason_code: _Optional[str] = ..., job_state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("node_id", "address", "status", "status_reason", "capacity", "allocated", "allocated_gpus", "topology", "gpu_model", "registered_at_ms", "last_heartbeat_age_ms", "members_run_as", "node_status", "gpu_faults", "unfit", "conditions", "member_isolation", "features", "spare", "draining_for", "draining_until_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_RUN_AS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    UNFIT_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ISOLATION_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    SPARE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FOR_FIELD_NUMBER: _ClassVar[int]
    DRAINING_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    status: str
    status_reason: str
    capacity: Resources
    allocated: Resources
    allocated_gpus: _containers.RepeatedScalarFieldContainer[int]
    topology: _containers.RepeatedCompositeFieldContainer[TopologyLabel]
    gpu_model: str
    registered_at_ms: int
    last_heartbeat_age_ms: int
    members_run_as: str
    node_status: NodeStatus
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    unfit: _containers.RepeatedCompositeFieldContainer[NodeUnfit]
    conditions: _containers.RepeatedCompositeFieldContainer[NodeCondition]
    member_isolation: str
    features: _containers.RepeatedScalarFieldContainer[str]
    spare: bool
    draining_for: str
    draining_until_ms: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., status: _Optional[str] = ..., status_reason: _Optional[str] = ..., capacity: _Optional[_Union[Resources, _Mapping]] = ..., allocated: _Optional[_Union[Resources, _Mapping]] = ..., allocated_gpus: _Optional[_Iterable[int]] = ..., topology: _Optional[_Iterable[_Union[TopologyLabel, _Mapping]]] = ..., gpu_model: _Optional[str] = ..., registered_at_ms: _Optional[int] = ..., last_heartbeat_age_ms: _Optional[int] = ..., members_run_as: _Optional[str] = ..., node_status: _Optional[_Union[NodeStatus, str]] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ..., unfit: _Optional[_Iterable[_Union[NodeUnfit, _Mapping]]] = ..., conditions: _Optional[_Iterable[_Union[NodeCondition, _Mapping]]] = ..., member_isolation: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ..., spare: _Optional[bool] = ..., draining_for: _Optional[str] = ..., draining_until_ms: _Optional[int] = ...) -> None: ...

class NodeCondition(_message.Message):
    __slots__ = ("name", "message", "since_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    message: str
    since_ms: int
    def __init__(self, name: _Optional[str] = ..., message: _Optional[str] = ..., since_ms: _Optional[int] = ...) -> None: ...

class NodeCheck(_message.Message):
    __slots__ = ("name", "failing", "message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FAILING_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    failing: bool
    message: str
    def __init__(self, name: _Optional[str] = ..., failing: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class NodeUnfit(_message.Message):
    __slots__ = ("owner", "detail", "until_ms")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    detail: str
    until_ms: int
    def __init__(self, owner: _Optional[str] = ..., detail: _Optional[str] = ..., until_ms: _Optional[int] = ...) -> None: ...

class GpuFault(_message.Message):
    __slots__ = ("gpu", "code", "detail", "since_ms")
    GPU_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    code: str
    detail: str
    since_ms: int
    def __init__(self, gpu: _Optional[int] = ..., code: _Optional[str] = ..., detail: _Optional[str] = ..., since_ms: _Optional[int] = ...) -> None: ...

class RepairGpusRequest(_message.Message):
    __slots__ = ("node_id", "gpus")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ...) -> None: ...

class RepairGpusResponse(_message.Message):
    __slots__ = ("message", "gpu_faults")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    message: str
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    def __init__(self, message: _Optional[str] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("allow_stale",)
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    allow_stale: bool
    def __init__(self, allow_stale: _Optional[bool] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "stale")
    NODES_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    stale: bool
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., stale: _Optional[bool] = ...) -> None: ...

class NodeStatusRequest(_message.Message):
    __slots__ = ("node_id", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class NodeStatusResponse(_message.Message):
    __slots__ = ("status", "node_status")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    status: str
    node_status: NodeStatus
    def __init__(self, status: _Optional[str] = ..., node_status: _Optional[_Union[NodeStatus, str]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "raft_address", "grpc_address", "role", "term", "commit_index", "last_applied", "leader_id", "healthy", "error", "format_version", "metrics_url", "dashboard_url", "replica_role")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    DASHBOARD_URL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ROLE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    raft_address: str
    grpc_address: str
    role: str
    term: int
    commit_index: int
    last_applied: int
    leader_id: str
    healthy: bool
    error: str
    format_version: int
    metrics_url: str
    dashboard_url: str
    replica_role: ReplicaRole
    def __init__(self, replica_id: _Optional[str] = ..., raft_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., last_applied: _Optional[int] = ..., leader_id: _Optional[str] = ..., healthy: _Optional[bool] = ..., error: _Optional[str] = ..., format_version: _Optional[int] = ..., metrics_url: _Optional[str] = ..., dashboard_url: _Optional[str] = ..., replica_role: _Optional[_Union[ReplicaRole, str]] = ...) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ("local_only",)
    LOCAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    local_only: bool
    def __init__(self, local_only: _Optional[bool] = ...) -> None: ...

class GetClusterStatusResponse(_message.Message):
    __slots__ = ("answered_by", "leader_id", "leader_address", "replicas", "nodes", "jobs", "pending_jobs", "running_jobs", "format_floor")
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FLOOR_FIELD_NUMBER: _ClassVar[int]
    answered_by: str
    leader_id: str
    leader_address: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    nodes: int
    jobs: int
    pending_jobs: int
    running_jobs: int
    format_floor: int
    def __init__(self, answered_by: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., nodes: _Optional[int] = ..., jobs: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., format_floor: _Optional[int] = ...) -> None: ...

class GetReplicaStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReplicaStateResponse(_message.Message):
    __slots__ = ("replica_id", "last_applied", "encoded_state", "state_sha256")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    ENCODED_STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    last_applied: int
    encoded_state: bytes
    state_sha256: str
    def __init__(self, replica_id: _Optional[str] = ..., last_applied: _Optional[int] = ..., encoded_state: _Optional[bytes] = ..., state_sha256: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("user", "role", "queues", "ttl_ms", "priority_classes", "max_priority", "user_role")
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    USER_ROLE_FIELD_NUMBER: _ClassVar[int]
    user: str
    role: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    ttl_ms: int
    priority_classes: _containers.RepeatedScalarFieldContainer[str]
    max_priority: int
    user_role: UserRole
    def __init__(self, user: _Optional[str] = ..., role: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., ttl_ms: _Optional[int] = ..., priority_classes: _Optional[_Iterable[str]] = ..., max_priority: _Optional[int] = ..., user_role: _Optional[_Union[UserRole, str]] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "token_id", "expires_at_ms")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    token: str
    token_id: str
    expires_at_ms: int
    def __init__(self, token: _Optional[str] = ..., token_id: _Optional[str] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class TokenInfo(_message.Message):
    __slots__ = ("token_id", "user", "role", "queues", "created_at_ms", "created_by", "expires_at_ms", "revoked_at_ms", "revoked_by", "priority_classes", "max_priority", "user_role")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    USER_ROLE_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    user: str
    role: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    created_at_ms: int
    created_by: str
    expires_at_ms: int
    revoked_at_ms: int
    revoked_by: str
    priority_classes: _containers.RepeatedScalarFieldContainer[str]
    max_priority: int
    user_role: UserRole
    def __init__(self, token_id: _Optional[str] = ..., user: _Optional[str] = ..., role: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., created_at_ms: _Optional[int] = ..., created_by: _Optional[str] = ..., expires_at_ms: _Optional[int] = ..., revoked_at_ms: _Optional[int] = ..., revoked_by: _Optional[str] = ..., priority_classes: _Optional[_Iterable[str]] = ..., max_priority: _Optional[int] = ..., user_role: _Optional[_Union[UserRole, str]] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenInfo]
    def __init__(self, tokens: _Optional[_Iterable[_Union[TokenInfo, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id",)
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    def __init__(self, token_id: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("revoked_at_ms",)
    REVOKED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    revoked_at_ms: int
    def __init__(self, revoked_at_ms: _Optional[int] = ...) -> None: ...

class GrantLogAccessRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "rank")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class GrantLogAccessResponse(_message.Message):
    __slots__ = ("grant", "node_id", "node_address", "expires_at_ms")
    GRANT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    grant: str
    node_id: str
    node_address: str
    expires_at_ms: int
    def __init__(self, grant: _Optional[str] = ..., node_id: _Optional[str] = ..., node_address: _Optional[str] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class HistoryAttempt(_message.Message):
    __slots__ = ("number", "fencing_token", "state", "nodes", "gpus", "bound_at_ms", "started_at_ms", "ended_at_ms", "gpu_ms", "outcome_code", "outcome", "attempt_state")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    BOUND_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_STATE_FIELD_NUMBER: _ClassVar[int]
    number: int
    fencing_token: int
    state: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    gpus: int
    bound_at_ms: int
    started_at_ms: int
    ended_at_ms: int
    gpu_ms: int
    outcome_code: str
    outcome: str
    attempt_state: AttemptState
    def __init__(self, number: _Optional[int] = ..., fencing_token: _Optional[int] = ..., state: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., gpus: _Optional[int] = ..., bound_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., gpu_ms: _Optional[int] = ..., outcome_code: _Optional[str] = ..., outcome: _Optional[str] = ..., attempt_state: _Optional[_Union[AttemptState, str]] = ...) -> None: ...

class HistoryJob(_message.Message):
    __slots__ = ("job_id", "name", "owner", "queue", "state", "reason_code", "reason", "submitted_at_ms", "started_at_ms", "finished_at_ms", "attempts", "retries_used", "requeues", "gpus_per_attempt", "gpu_ms", "nodes", "cancelled_by", "spec", "attempt_list", "applied_index", "job_state", "checkpoint", "resume_step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_USED_FIELD_NUMBER: _ClassVar[int]
    REQUEUES_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GPU_MS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_BY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_LIST_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    owner: str
    queue: str
    state: str
    reason_code: str
    reason: str
    submitted_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    attempts: int
    retries_used: int
    requeues: int
    gpus_per_attempt: int
    gpu_ms: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    cancelled_by: str
    spec: JobSpec
    attempt_list: _containers.RepeatedCompositeFieldContainer[HistoryAttempt]
    applied_index: int
    job_state: JobState
    checkpoint: Checkpoint
    resume_step: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[str] = ..., reason_code: _Optional[str] = ..., reason: _Optional[str] = ..., submitted_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., attempts: _Optional[int] = ..., retries_used: _Optional[int] = ..., requeues: _Optional[int] = ..., gpus_per_attempt: _Optional[int] = ..., gpu_ms: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., cancelled_by: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., attempt_list: _Optional[_Iterable[_Union[HistoryAttempt, _Mapping]]] = ..., applied_index: _Optional[int] = ..., job_state: _Optional[_Union[JobState, str]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., resume_step: _Optional[int] = ...) -> None: ...

class ListHistoryRequest(_message.Message):
    __slots__ = ("user", "queue", "node_id", "since_ms", "until_ms", "limit")
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user: str
    queue: str
    node_id: str
    since_ms: int
    until_ms: int
    limit: int
    def __init__(self, user: _Optional[str] = ..., queue: _Optional[str] = ..., node_id: _Optional[str] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListHistoryResponse(_message.Message):
    __slots__ = ("jobs", "answered_by")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[HistoryJob]
    answered_by: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[HistoryJob, _Mapping]]] = ..., answered_by: _Optional[str] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("by", "since_ms", "until_ms")
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    by: str
    since_ms: int
    until_ms: int
    def __init__(self, by: _Optional[str] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("key", "day", "gpu_ms", "attempts")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DAY_FIELD_NUMBER: _ClassVar[int]
    GPU_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    key: str
    day: str
    gpu_ms: int
    attempts: int
    def __init__(self, key: _Optional[str] = ..., day: _Optional[str] = ..., gpu_ms: _Optional[int] = ..., attempts: _Optional[int] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("rows", "by", "since_ms", "until_ms", "answered_by")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    by: str
    since_ms: int
    until_ms: int
    answered_by: str
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., by: _Optional[str] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., answered_by: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("index", "kind", "time_ms", "job_id", "job_name", "owner", "queue", "attempt", "nodes", "node_id", "reason_code", "detail", "leader_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIME_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    time_ms: int
    job_id: str
    job_name: str
    owner: str
    queue: str
    attempt: int
    nodes: _containers.RepeatedScalarFieldContainer[str]
    node_id: str
    reason_code: str
    detail: str
    leader_id: str
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., time_ms: _Optional[int] = ..., job_id: _Optional[str] = ..., job_name: _Optional[str] = ..., owner: _Optional[str] = ..., queue: _Optional[str] = ..., attempt: _Optional[int] = ..., nodes: _Optional[_Iterable[str]] = ..., node_id: _Optional[str] = ..., reason_code: _Optional[str] = ..., detail: _Optional[str] = ..., leader_id: _Optional[str] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("since_index", "follow")
    SINCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    since_index: int
    follow: bool
    def __init__(self, since_index: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "gpu", "cpu_milli", "memory_mib", "cohort", "borrowing_limit_gpu", "lending_limit_gpu", "priority_classes", "max_priority", "min_runtime_ms", "running_members_per_user", "members_per_node_per_user", "default_time_limit_ms", "learned_estimates")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    BORROWING_LIMIT_GPU_FIELD_NUMBER: _ClassVar[int]
    LENDING_LIMIT_GPU_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_MS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_MEMBERS_PER_USER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_PER_NODE_PER_USER_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TIME_LIMIT_MS_FIELD_NUMBER: _ClassVar[int]
    LEARNED_ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu: int
    cpu_milli: int
    memory_mib: int
    cohort: str
    borrowing_limit_gpu: int
    lending_limit_gpu: int
    priority_classes: _containers.RepeatedScalarFieldContainer[str]
    max_priority: int
    min_runtime_ms: int
    running_members_per_user: int
    members_per_node_per_user: int
    default_time_limit_ms: int
    learned_estimates: bool
    def __init__(self, name: _Optional[str] = ..., gpu: _Optional[int] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., cohort: _Optional[str] = ..., borrowing_limit_gpu: _Optional[int] = ..., lending_limit_gpu: _Optional[int] = ..., priority_classes: _Optional[_Iterable[str]] = ..., max_priority: _Optional[int] = ..., min_runtime_ms: _Optional[int] = ..., running_members_per_user: _Optional[int] = ..., members_per_node_per_user: _Optional[int] = ..., default_time_limit_ms: _Optional[int] = ..., learned_estimates: _Optional[bool] = ...) -> None: ...

class QueueUsage(_message.Message):
    __slots__ = ("used_gpu", "used_cpu_milli", "used_memory_mib", "borrowed_gpu", "lent_gpu", "running_jobs", "pending_jobs", "pending_gpu", "preempting_jobs")
    USED_GPU_FIELD_NUMBER: _ClassVar[int]
    USED_CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPU_FIELD_NUMBER: _ClassVar[int]
    LENT_GPU_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    PENDING_GPU_FIELD_NUMBER: _ClassVar[int]
    PREEMPTING_JOBS_FIELD_NUMBER: _ClassVar[int]
    used_gpu: int
    used_cpu_milli: int
    used_memory_mib: int
    borrowed_gpu: int
    lent_gpu: int
    running_jobs: int
    pending_jobs: int
    pending_gpu: int
    preempting_jobs: int
    def __init__(self, used_gpu: _Optional[int] = ..., used_cpu_milli: _Optional[int] = ..., used_memory_mib: _Optional[int] = ..., borrowed_gpu: _Optional[int] = ..., lent_gpu: _Optional[int] = ..., running_jobs: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., pending_gpu: _Optional[int] = ..., preempting_jobs: _Optional[int] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("queue", "usage", "fair_share_ppm", "cohort_shares_ppm", "fair_share_position")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_PPM_FIELD_NUMBER: _ClassVar[int]
    COHORT_SHARES_PPM_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_POSITION_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    usage: QueueUsage
    fair_share_ppm: int
    cohort_shares_ppm: _containers.RepeatedScalarFieldContainer[int]
    fair_share_position: int
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., usage: _Optional[_Union[QueueUsage, _Mapping]] = ..., fair_share_ppm: _Optional[int] = ..., cohort_shares_ppm: _Optional[_Iterable[int]] = ..., fair_share_position: _Optional[int] = ...) -> None: ...

class PriorityClass(_message.Message):
    __slots__ = ("name", "value", "preempts", "grace_ms", "min_runtime_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PREEMPTS_FIELD_NUMBER: _ClassVar[int]
    GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_RUNTIME_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    preempts: bool
    grace_ms: int
    min_runtime_ms: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ..., preempts: _Optional[bool] = ..., grace_ms: _Optional[int] = ..., min_runtime_ms: _Optional[int] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("allow_stale",)
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    allow_stale: bool
    def __init__(self, allow_stale: _Optional[bool] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "stale", "priority_classes", "preemption", "reclaim_wait_max_ms", "cohorts", "fair_share_half_life_ms")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_WAIT_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    COHORTS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_HALF_LIFE_MS_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStatus]
    stale: bool
    priority_classes: _containers.RepeatedCompositeFieldContainer[PriorityClass]
    preemption: str
    reclaim_wait_max_ms: int
    cohorts: _containers.RepeatedCompositeFieldContainer[CohortStatus]
    fair_share_half_life_ms: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStatus, _Mapping]]] = ..., stale: _Optional[bool] = ..., priority_classes: _Optional[_Iterable[_Union[PriorityClass, _Mapping]]] = ..., preemption: _Optional[str] = ..., reclaim_wait_max_ms: _Optional[int] = ..., cohorts: _Optional[_Iterable[_Union[CohortStatus, _Mapping]]] = ..., fair_share_half_life_ms: _Optional[int] = ...) -> None: ...

class Cohort(_message.Message):
    __slots__ = ("name", "parent", "gpu", "borrowing_limit_gpu", "lending_limit_gpu", "fair_sharing_preemption")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    BORROWING_LIMIT_GPU_FIELD_NUMBER: _ClassVar[int]
    LENDING_LIMIT_GPU_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARING_PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    parent: str
    gpu: int
    borrowing_limit_gpu: int
    lending_limit_gpu: int
    fair_sharing_preemption: bool
    def __init__(self, name: _Optional[str] = ..., parent: _Optional[str] = ..., gpu: _Optional[int] = ..., borrowing_limit_gpu: _Optional[int] = ..., lending_limit_gpu: _Optional[int] = ..., fair_sharing_preemption: _Optional[bool] = ...) -> None: ...

class CohortStatus(_message.Message):
    __slots__ = ("cohort", "defined", "nominal_gpu", "used_gpu", "borrowed_gpu", "lendable_gpu")
    COHORT_FIELD_NUMBER: _ClassVar[int]
    DEFINED_FIELD_NUMBER: _ClassVar[int]
    NOMINAL_GPU_FIELD_NUMBER: _ClassVar[int]
    USED_GPU_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPU_FIELD_NUMBER: _ClassVar[int]
    LENDABLE_GPU_FIELD_NUMBER: _ClassVar[int]
    cohort: Cohort
    defined: bool
    nominal_gpu: int
    used_gpu: int
    borrowed_gpu: int
    lendable_gpu: int
    def __init__(self, cohort: _Optional[_Union[Cohort, _Mapping]] = ..., defined: _Optional[bool] = ..., nominal_gpu: _Optional[int] = ..., used_gpu: _Optional[int] = ..., borrowed_gpu: _Optional[int] = ..., lendable_gpu: _Optional[int] = ...) -> None: ...

class SetCohortRequest(_message.Message):
    __slots__ = ("cohort",)
    COHORT_FIELD_NUMBER: _ClassVar[int]
    cohort: Cohort
    def __init__(self, cohort: _Optional[_Union[Cohort, _Mapping]] = ...) -> None: ...

class SetCohortResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class DeleteCohortRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteCohortResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class SetQueueResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("spec_bytes", "env_bytes", "pending_jobs_per_user", "pending_jobs_per_queue", "submit_burst", "submit_per_s", "watch_streams_per_identity", "watch_streams_total", "member_min_cpu_milli", "member_min_memory_mib", "member_overhead_memory_mib", "running_members_per_user", "members_per_node_per_user")
    SPEC_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENV_BYTES_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_PER_USER_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_PER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_BURST_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_PER_S_FIELD_NUMBER: _ClassVar[int]
    WATCH_STREAMS_PER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    WATCH_STREAMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMBER_MIN_CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMBER_MIN_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    MEMBER_OVERHEAD_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    RUNNING_MEMBERS_PER_USER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_PER_NODE_PER_USER_FIELD_NUMBER: _ClassVar[int]
    spec_bytes: int
    env_bytes: int
    pending_jobs_per_user: int
    pending_jobs_per_queue: int
    submit_burst: int
    submit_per_s: int
    watch_streams_per_identity: int
    watch_streams_total: int
    member_min_cpu_milli: int
    member_min_memory_mib: int
    member_overhead_memory_mib: int
    running_members_per_user: int
    members_per_node_per_user: int
    def __init__(self, spec_bytes: _Optional[int] = ..., env_bytes: _Optional[int] = ..., pending_jobs_per_user: _Optional[int] = ..., pending_jobs_per_queue: _Optional[int] = ..., submit_burst: _Optional[int] = ..., submit_per_s: _Optional[int] = ..., watch_streams_per_identity: _Optional[int] = ..., watch_streams_total: _Optional[int] = ..., member_min_cpu_milli: _Optional[int] = ..., member_min_memory_mib: _Optional[int] = ..., member_overhead_memory_mib: _Optional[int] = ..., running_members_per_user: _Optional[int] = ..., members_per_node_per_user: _Optional[int] = ...) -> None: ...

class GetLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: Limits
    def __init__(self, limits: _Optional[_Union[Limits, _Mapping]] = ...) -> None: ...

class SetLimitsRequest(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[LimitValue]
    def __init__(self, values: _Optional[_Iterable[_Union[LimitValue, _Mapping]]] = ...) -> None: ...

class LimitValue(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "address", "capacity", "gpu_islands", "gpu_model", "topology", "features", "members_run_as", "boot_id", "unreachable_streams", "member_isolation", "reports")
    class GpuIsland(_message.Message):
        __slots__ = ("gpus",)
        GPUS_FIELD_NUMBER: _ClassVar[int]
        gpus: _containers.RepeatedScalarFieldContainer[int]
        def __init__(self, gpus: _Optional[_Iterable[int]] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    GPU_ISLANDS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_RUN_AS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ISOLATION_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    capacity: Resources
    gpu_islands: _containers.RepeatedCompositeFieldContainer[RegisterNodeRequest.GpuIsland]
    gpu_model: str
    topology: _containers.RepeatedCompositeFieldContainer[TopologyLabel]
    features: _containers.RepeatedScalarFieldContainer[str]
    members_run_as: str
    boot_id: str
    unreachable_streams: _containers.RepeatedScalarFieldContainer[str]
    member_isolation: str
    reports: _containers.RepeatedCompositeFieldContainer[MemberReport]
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., capacity: _Optional[_Union[Resources, _Mapping]] = ..., gpu_islands: _Optional[_Iterable[_Union[RegisterNodeRequest.GpuIsland, _Mapping]]] = ..., gpu_model: _Optional[str] = ..., topology: _Optional[_Iterable[_Union[TopologyLabel, _Mapping]]] = ..., features: _Optional[_Iterable[str]] = ..., members_run_as: _Optional[str] = ..., boot_id: _Optional[str] = ..., unreachable_streams: _Optional[_Iterable[str]] = ..., member_isolation: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("status", "heartbeat_interval_ms", "lease_ttl_ms", "stream_address", "node_status", "relayed", "acked_reports")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    RELAYED_FIELD_NUMBER: _ClassVar[int]
    ACKED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    status: str
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    stream_address: str
    node_status: NodeStatus
    relayed: bool
    acked_reports: int
    def __init__(self, status: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., stream_address: _Optional[str] = ..., node_status: _Optional[_Union[NodeStatus, str]] = ..., relayed: _Optional[bool] = ..., acked_reports: _Optional[int] = ...) -> None: ...

class MemberReport(_message.Message):
    __slots__ = ("job_id", "fencing_token", "rank", "kind", "exit_code", "detail", "cause", "checkpoint_step", "checkpoint_seq", "generation")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[MemberReport.Kind]
        STARTED: _ClassVar[MemberReport.Kind]
        EXITED: _ClassVar[MemberReport.Kind]
        CHECKPOINT: _ClassVar[MemberReport.Kind]
    KIND_UNSPECIFIED: MemberReport.Kind
    STARTED: MemberReport.Kind
    EXITED: MemberReport.Kind
    CHECKPOINT: MemberReport.Kind
    class Cause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PROGRAM: _ClassVar[MemberReport.Cause]
        FENCED: _ClassVar[MemberReport.Cause]
        LOST: _ClassVar[MemberReport.Cause]
        NODE_CANNOT_RUN: _ClassVar[MemberReport.Cause]
        HUNG: _ClassVar[MemberReport.Cause]
    PROGRAM: MemberReport.Cause
    FENCED: MemberReport.Cause
    LOST: MemberReport.Cause
    NODE_CANNOT_RUN: MemberReport.Cause
    HUNG: MemberReport.Cause
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEQ_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fencing_token: int
    rank: int
    kind: MemberReport.Kind
    exit_code: int
    detail: str
    cause: MemberReport.Cause
    checkpoint_step: int
    checkpoint_seq: int
    generation: int
    def __init__(self, job_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., rank: _Optional[int] = ..., kind: _Optional[_Union[MemberReport.Kind, str]] = ..., exit_code: _Optional[int] = ..., detail: _Optional[str] = ..., cause: _Optional[_Union[MemberReport.Cause, str]] = ..., checkpoint_step: _Optional[int] = ..., checkpoint_seq: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class DesiredMember(_message.Message):
    __slots__ = ("job_id", "fencing_token", "attempt", "rank", "world_size", "gpus", "master_addr", "master_port", "member_hosts", "local_rank", "local_world_size", "command", "shell", "env", "workdir", "time_limit_ms", "image", "cpu_milli", "memory_mib", "owner", "preemption", "preempted_by", "preempt_grace_ms", "prestart_command", "prestart_shell", "prestart_timeout_ms", "progress_timeout_ms", "progress_source", "resume_step", "stop_grace_ms", "generation", "membership", "membership_signal")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    MEMBER_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_MS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLI_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_BY_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    PRESTART_COMMAND_FIELD_NUMBER: _ClassVar[int]
    PRESTART_SHELL_FIELD_NUMBER: _ClassVar[int]
    PRESTART_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    STOP_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fencing_token: int
    attempt: int
    rank: int
    world_size: int
    gpus: _containers.RepeatedScalarFieldContainer[int]
    master_addr: str
    master_port: int
    member_hosts: _containers.RepeatedScalarFieldContainer[str]
    local_rank: int
    local_world_size: int
    command: _containers.RepeatedScalarFieldContainer[str]
    shell: bool
    env: _containers.RepeatedCompositeFieldContainer[EnvVar]
    workdir: str
    time_limit_ms: int
    image: str
    cpu_milli: int
    memory_mib: int
    owner: str
    preemption: str
    preempted_by: str
    preempt_grace_ms: int
    prestart_command: _containers.RepeatedScalarFieldContainer[str]
    prestart_shell: bool
    prestart_timeout_ms: int
    progress_timeout_ms: int
    progress_source: str
    resume_step: int
    stop_grace_ms: int
    generation: int
    membership: int
    membership_signal: str
    def __init__(self, job_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., gpus: _Optional[_Iterable[int]] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., member_hosts: _Optional[_Iterable[str]] = ..., local_rank: _Optional[int] = ..., local_world_size: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., shell: _Optional[bool] = ..., env: _Optional[_Iterable[_Union[EnvVar, _Mapping]]] = ..., workdir: _Optional[str] = ..., time_limit_ms: _Optional[int] = ..., image: _Optional[str] = ..., cpu_milli: _Optional[int] = ..., memory_mib: _Optional[int] = ..., owner: _Optional[str] = ..., preemption: _Optional[str] = ..., preempted_by: _Optional[str] = ..., preempt_grace_ms: _Optional[int] = ..., prestart_command: _Optional[_Iterable[str]] = ..., prestart_shell: _Optional[bool] = ..., prestart_timeout_ms: _Optional[int] = ..., progress_timeout_ms: _Optional[int] = ..., progress_source: _Optional[str] = ..., resume_step: _Optional[int] = ..., stop_grace_ms: _Optional[int] = ..., generation: _Optional[int] = ..., membership: _Optional[int] = ..., membership_signal: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("node_id", "reports", "running", "gpu_faults", "checks", "paces")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    PACES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reports: _containers.RepeatedCompositeFieldContainer[MemberReport]
    running: _containers.RepeatedCompositeFieldContainer[MemberReport]
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    checks: _containers.RepeatedCompositeFieldContainer[NodeCheck]
    paces: _containers.RepeatedCompositeFieldContainer[MemberPace]
    def __init__(self, node_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ..., checks: _Optional[_Iterable[_Union[NodeCheck, _Mapping]]] = ..., paces: _Optional[_Iterable[_Union[MemberPace, _Mapping]]] = ...) -> None: ...

class MemberPace(_message.Message):
    __slots__ = ("job_id", "fencing_token", "rank", "step_us", "steps", "peers")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_US_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    fencing_token: int
    rank: int
    step_us: int
    steps: int
    peers: str
    def __init__(self, job_id: _Optional[str] = ..., fencing_token: _Optional[int] = ..., rank: _Optional[int] = ..., step_us: _Optional[int] = ..., steps: _Optional[int] = ..., peers: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "reports", "running", "gpu_faults", "checks", "heartbeat")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reports: _containers.RepeatedCompositeFieldContainer[MemberReport]
    running: _containers.RepeatedCompositeFieldContainer[MemberReport]
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    checks: _containers.RepeatedCompositeFieldContainer[NodeCheck]
    heartbeat: Heartbeat
    def __init__(self, node_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ..., checks: _Optional[_Iterable[_Union[NodeCheck, _Mapping]]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("desired", "lease_ttl_ms", "heartbeat_interval_ms", "acked_reports", "node_status_name", "leader_term", "node_status")
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ACKED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    desired: _containers.RepeatedCompositeFieldContainer[DesiredMember]
    lease_ttl_ms: int
    heartbeat_interval_ms: int
    acked_reports: int
    node_status_name: str
    leader_term: int
    node_status: NodeStatus
    def __init__(self, desired: _Optional[_Iterable[_Union[DesiredMember, _Mapping]]] = ..., lease_ttl_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., acked_reports: _Optional[int] = ..., node_status_name: _Optional[str] = ..., leader_term: _Optional[int] = ..., node_status: _Optional[_Union[NodeStatus, str]] = ...) -> None: ...

class RelayedHeartbeat(_message.Message):
    __slots__ = ("node_id", "reports", "gpu_faults", "checks", "heartbeat", "waited_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reports: _containers.RepeatedCompositeFieldContainer[MemberReport]
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    checks: _containers.RepeatedCompositeFieldContainer[NodeCheck]
    heartbeat: Heartbeat
    waited_ms: int
    def __init__(self, node_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ..., checks: _Optional[_Iterable[_Union[NodeCheck, _Mapping]]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., waited_ms: _Optional[int] = ...) -> None: ...

class RelayHeartbeatsRequest(_message.Message):
    __slots__ = ("replica_id", "stream_address", "heartbeats")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    stream_address: str
    heartbeats: _containers.RepeatedCompositeFieldContainer[RelayedHeartbeat]
    def __init__(self, replica_id: _Optional[str] = ..., stream_address: _Optional[str] = ..., heartbeats: _Optional[_Iterable[_Union[RelayedHeartbeat, _Mapping]]] = ...) -> None: ...

class RelayedRefusal(_message.Message):
    __slots__ = ("index", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RelayHeartbeatsResponse(_message.Message):
    __slots__ = ("leader_term", "applied_commands", "acked_reports", "refusals", "relay")
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    ACKED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    leader_term: int
    applied_commands: int
    acked_reports: _containers.RepeatedScalarFieldContainer[int]
    refusals: _containers.RepeatedCompositeFieldContainer[RelayedRefusal]
    relay: bool
    def __init__(self, leader_term: _Optional[int] = ..., applied_commands: _Optional[int] = ..., acked_reports: _Optional[_Iterable[int]] = ..., refusals: _Optional[_Iterable[_Union[RelayedRefusal, _Mapping]]] = ..., relay: _Optional[bool] = ...) -> None: ...

class ReplicaMember(_message.Message):
    __slots__ = ("replica_id", "raft_address", "grpc_address", "live")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    raft_address: str
    grpc_address: str
    live: bool
    def __init__(self, replica_id: _Optional[str] = ..., raft_address: _Optional[str] = ..., grpc_address: _Optional[str] = ..., live: _Optional[bool] = ...) -> None: ...

class AddReplicaRequest(_message.Message):
    __slots__ = ("replica_id", "raft_address", "grpc_address")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    raft_address: str
    grpc_address: str
    def __init__(self, replica_id: _Optional[str] = ..., raft_address: _Optional[str] = ..., grpc_address: _Optional[str] = ...) -> None: ...

class RemoveReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class MembershipResponse(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[ReplicaMember]
    def __init__(self, members: _Optional[_Iterable[_Union[ReplicaMember, _Mapping]]] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("data", "raft_index", "raft_term", "replica_id", "total_bytes", "sha256")
    DATA_FIELD_NUMBER: _ClassVar[int]
    RAFT_INDEX_FIELD_NUMBER: _ClassVar[int]
    RAFT_TERM_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    raft_index: int
    raft_term: int
    replica_id: str
    total_bytes: int
    sha256: str
    def __init__(self, data: _Optional[bytes] = ..., raft_index: _Optional[int] = ..., raft_term: _Optional[int] = ..., replica_id: _Optional[str] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("seq", "node_id", "reports", "running", "gpu_faults", "checks", "heartbeat")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    GPU_FAULTS_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    node_id: str
    reports: _containers.RepeatedCompositeFieldContainer[MemberReport]
    running: _containers.RepeatedCompositeFieldContainer[MemberReport]
    gpu_faults: _containers.RepeatedCompositeFieldContainer[GpuFault]
    checks: _containers.RepeatedCompositeFieldContainer[NodeCheck]
    heartbeat: Heartbeat
    def __init__(self, seq: _Optional[int] = ..., node_id: _Optional[str] = ..., reports: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., gpu_faults: _Optional[_Iterable[_Union[GpuFault, _Mapping]]] = ..., checks: _Optional[_Iterable[_Union[NodeCheck, _Mapping]]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class LeaderMessage(_message.Message):
    __slots__ = ("ack_seq", "acked_reports", "lease_ttl_ms", "heartbeat_interval_ms", "node_status_name", "leader_term", "has_desired", "desired", "node_status")
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    HAS_DESIRED_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    NODE_STATUS_FIELD_NUMBER: _ClassVar[int]
    ack_seq: int
    acked_reports: int
    lease_ttl_ms: int
    heartbeat_interval_ms: int
    node_status_name: str
    leader_term: int
    has_desired: bool
    desired: _containers.RepeatedCompositeFieldContainer[DesiredMember]
    node_status: NodeStatus
    def __init__(self, ack_seq: _Optional[int] = ..., acked_reports: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., node_status_name: _Optional[str] = ..., leader_term: _Optional[int] = ..., has_desired: _Optional[bool] = ..., desired: _Optional[_Iterable[_Union[DesiredMember, _Mapping]]] = ..., node_status: _Optional[_Union[NodeStatus, str]] = ...) -> None: ...
