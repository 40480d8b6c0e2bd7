"""The wire types: every request and response model of the HTTP API (and the OpenAPI page at
/docs), one module per concern, all re-exported here (``from grpo_service.models import X``).

Field names follow the task-app contract the project started from and the reference service
(`env_id`, `observation`, `info`, `step_idx`, `reward`, `done`, `truncated`, `snapshot_id`,
`policy_id`, `bound_env_id`, `tool_calls`, `meta`, `dry_run`). Requests forbid unknown fields
so typos fail loudly.
"""

from __future__ import annotations

from grpo_service.models.batch import (  # noqa: F401
    BatchRolloutResult,
    BatchRolloutsRequest,
    BatchRolloutsResponse,
    TurnTokens,
)
from grpo_service.models.branch import (  # noqa: F401
    BranchChild,
    BranchRequest,
    BranchResponse,
)
from grpo_service.models.common import (  # noqa: F401
    DEFAULT_RUN,
    ENV_ID,
    ENV_SNAPSHOT_ID,
    MAX_OPS,
    MAX_TURNS,
    POLICY_ID,
    POLICY_SNAPSHOT_ID,
    RUN_ID,
    SYNTH_COMPAT_HELP,
    Action,
    ConfigDict_,
    ErrorBody,
    Id,
    Name,
    Request,
    RunId,
    RunOwner,
    RunStatus,
    Seed,
    check_ops,
    request_config,
)
from grpo_service.models.env import (  # noqa: F401
    EnvAction,
    EnvCreateRequest,
    EnvCreateResponse,
    EnvResetRequest,
    EnvResetResponse,
    EnvRestoreRequest,
    EnvRestoreResponse,
    EnvSnapshotRequest,
    EnvState,
    EnvStepRequest,
    EnvStepResponse,
    EnvTerminateRequest,
    RestoreRequest,
    SnapshotRequest,
    SnapshotResponse,
    TerminateResponse,
)
from grpo_service.models.group import (  # noqa: F401
    ForkNode,
    ForkPlan,
    GroupMember,
    GroupMetrics,
    GroupTree,
    RolloutGroupRequest,
    RolloutGroupResponse,
    RunStarted,
)
from grpo_service.models.group_stream import (  # noqa: F401
    StreamBatch,
    StreamCounters,
    StreamGroup,
    StreamInfo,
    StreamOpenRequest,
    StreamTakeRequest,
    StreamVersionRequest,
)
from grpo_service.models.meta import (  # noqa: F401
    Health,
    InferenceInfo,
    Limits,
    PluginInfo,
    ServiceEndpoints,
    ServiceInfo,
)
from grpo_service.models.pages import (  # noqa: F401
    EnvList,
    EnvSummary,
    LiveObjectSummary,
    PageInfo,
    PolicyList,
    PolicySummary,
    RunList,
    RunSummary,
)
from grpo_service.models.policy import (  # noqa: F401
    LLMCallRecord,
    LLMTokens,
    PolicyCreateRequest,
    PolicyCreateResponse,
    PolicyRestoreRequest,
    PolicyRestoreResponse,
    PolicySnapshotRequest,
    PolicyStepRequest,
    PolicyStepResponse,
    PolicyTerminateRequest,
)
from grpo_service.models.rollout import (  # noqa: F401
    Op,
    RolloutEnvSpec,
    RolloutMetrics,
    RolloutPlan,
    RolloutPolicySpec,
    RolloutRecordConfig,
    RolloutRequest,
    RolloutResponse,
    RolloutSafetyConfig,
    RolloutStep,
    Trajectory,
)
from grpo_service.models.runs import (  # noqa: F401
    RunAbortRequest,
    RunAbortResponse,
    RunMemberStatus,
    RunProgress,
    RunStatusResponse,
)
from grpo_service.models.stream import StreamSpan, TokenStream  # noqa: F401
