"""The administrative methods of ``SchedulerService``: tokens, the per-identity limits,
queues and the cohort tree."""

from __future__ import annotations

import dataclasses

import grpc

from synapse_ha.core import commands as cmd
from synapse_ha.core.identity import admission
from synapse_ha.core.identity.access import Role
from synapse_ha.core.queues.cohort_tree import check_cohort
from synapse_ha.core.queues.usage import queues_now
from synapse_ha.core.spec import validation
from synapse_ha.core.spec.document import SpecError
from synapse_ha.rpc import from_proto, states, to_proto
from synapse_ha.rpc.auth import caller, new_token
from synapse_ha.rpc.errors import ErrorReason, abort, abort_invalid
from synapse_ha.rpc.gen.synapse.v1 import control_pb2 as pb
from synapse_ha.rpc.server.context import Servicer, abort_spec_error


class AdminService(Servicer):
    """Tokens, per-identity limits and queues."""

    # ------------------------------------------------------------------- tokens

    def CreateToken(
        self, request: pb.CreateTokenRequest, context: grpc.ServicerContext
    ) -> pb.CreateTokenResponse:
        identity = caller(context)
        asked = states.requested_user_role(request)
        try:
            role: object = Role(asked or Role.USER)
        except ValueError:
            role = asked
        queues = list(request.queues)
        classes = tuple(request.priority_classes)
        violations = validation.check_token("", request.user, role, queues, "0" * 64, 0)
        violations += admission.check_priority_allowance(classes, request.max_priority)
        if request.ttl_ms < 0:
            violations.append(validation.invalid("ttl_ms", "must be 0 (never) or positive"))
        if violations:
            abort_invalid(context, violations)
        assert isinstance(role, Role)
        text, command = new_token(
            request.user,
            role,
            queues,
            request.ttl_ms,
            self.ctx.clock_ms(),
            str(identity),
            classes,
            request.max_priority,
        )
        audited = ("CreateToken", f"{command.token_id} ({request.user}, role {role})")
        self._write(context, identity, command, audited)
        return pb.CreateTokenResponse(
            token=text, token_id=command.token_id, expires_at_ms=command.expires_at_ms
        )

    def ListTokens(
        self, request: pb.ListTokensRequest, context: grpc.ServicerContext
    ) -> pb.ListTokensResponse:
        self._read_mode(context, allow_stale=False, follower=False)
        tokens = self.ctx.backend.snapshot().tokens.values()
        ordered = sorted(tokens, key=lambda t: (t.created_at_ms, t.token_id))
        return pb.ListTokensResponse(tokens=[to_proto.token_to_proto(t) for t in ordered])

    def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: grpc.ServicerContext
    ) -> pb.RevokeTokenResponse:
        self._remove(
            context,
            cmd.RevokeToken,
            "token_id",
            request.token_id,
            (ErrorReason.TOKEN_NOT_FOUND, "token_id"),
        )
        token = self.ctx.backend.snapshot().tokens.get(request.token_id)
        return pb.RevokeTokenResponse(revoked_at_ms=token.revoked_at_ms if token else 0)

    # ------------------------------------------------------------ per-identity limits

    def GetLimits(
        self, request: pb.GetLimitsRequest, context: grpc.ServicerContext
    ) -> pb.GetLimitsResponse:
        limits = self.ctx.backend.cluster_config().limits
        return pb.GetLimitsResponse(limits=to_proto.limits_to_proto(limits))

    def SetLimits(
        self, request: pb.SetLimitsRequest, context: grpc.ServicerContext
    ) -> pb.GetLimitsResponse:
        """Replicate the limits with the named ones changed (admins only). A limit this
        leader's configuration file sets is refused: the leader would put it back."""
        identity = caller(context)
        self._require_serving_leader(context)
        config = self.ctx.backend.cluster_config()
        try:
            limits = from_proto.limits_with(config.limits, request.values)
        except SpecError as exc:
            abort_spec_error(context, exc)
        pinned = sorted({v.name for v in request.values} & self.ctx.pinned_limits)
        if pinned:
            abort(
                context,
                ErrorReason.CONFLICT,
                f"limits {', '.join(pinned)} are set by the leader's configuration file "
                f"([limits] in its TOML), which it puts back: change them there",
            )
        violations = admission.check_limits(limits)
        if violations:
            abort_invalid(context, violations)
        wanted = dataclasses.replace(config, limits=limits)
        command = cmd.Configure(config=wanted, now_ms=self.ctx.clock_ms(), actor=str(identity))
        changed = ", ".join(f"{v.name}={v.value}" for v in request.values)
        self._write(context, identity, command, ("SetLimits", changed or "nothing"))
        limits = self.ctx.backend.cluster_config().limits
        return pb.GetLimitsResponse(limits=to_proto.limits_to_proto(limits))

    # ------------------------------------------------- queues and preemption

    def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.ServicerContext
    ) -> pb.ListQueuesResponse:
        """Every queue with its settings, usage and place in the fair-share order
        (:func:`synapse_ha.core.queues.usage.queues_now`, one pass over the jobs), the
        cluster's priority classes, preemption mode and reclaim wait, and the cohort
        tree."""
        stale = self._read_mode(context, request.allow_stale)
        state = self.ctx.backend.snapshot()
        with self._heavy_read(context, request.allow_stale):
            now = queues_now(state, self.ctx.clock_ms())
        return pb.ListQueuesResponse(
            queues=[
                pb.QueueStatus(
                    queue=to_proto.queue_to_proto(state.queues[name]),
                    usage=to_proto.queue_usage_to_proto(now.usage[name]),
                    fair_share_ppm=now.standings[name].share,
                    cohort_shares_ppm=now.standings[name].cohort_shares,
                    fair_share_position=now.standings[name].position,
                )
                for name in sorted(state.queues)
            ],
            stale=stale,
            priority_classes=[
                to_proto.priority_class_to_proto(c) for c in state.config.priority_classes
            ],
            preemption=str(state.config.preemption),
            reclaim_wait_max_ms=state.config.reclaim_wait_max_ms,
            cohorts=[to_proto.cohort_status_to_proto(c) for c in now.cohorts],
            fair_share_half_life_ms=state.config.fair_share_half_life_ms,
        )

    def SetQueue(
        self, request: pb.SetQueueRequest, context: grpc.ServicerContext
    ) -> pb.SetQueueResponse:
        identity, state = self._writer(context, request, "queue")
        queue = from_proto.queue_from_proto(request.queue)
        command = cmd.SetQueue(queue=queue, now_ms=self.ctx.clock_ms(), actor=str(identity))
        violations = validation.check_queue(queue, state.config.priority_classes)
        return pb.SetQueueResponse(
            created=self._put(context, identity, command, queue.name, state.queues, violations)
        )

    def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: grpc.ServicerContext
    ) -> pb.DeleteQueueResponse:
        not_found = (ErrorReason.QUEUE_NOT_FOUND, "queue")
        self._remove(context, cmd.DeleteQueue, "name", request.name, not_found)
        return pb.DeleteQueueResponse()

    def SetCohort(
        self, request: pb.SetCohortRequest, context: grpc.ServicerContext
    ) -> pb.SetCohortResponse:
        identity, state = self._writer(context, request, "cohort")
        cohort = from_proto.cohort_from_proto(request.cohort)
        command = cmd.SetCohort(cohort=cohort, now_ms=self.ctx.clock_ms(), actor=str(identity))
        violations = check_cohort(cohort, state.cohorts)
        created = self._put(context, identity, command, cohort.name, state.cohorts, violations)
        return pb.SetCohortResponse(created=created)

    def DeleteCohort(
        self, request: pb.DeleteCohortRequest, context: grpc.ServicerContext
    ) -> pb.DeleteCohortResponse:
        not_found = (ErrorReason.COHORT_NOT_FOUND, "cohort")
        self._remove(context, cmd.DeleteCohort, "name", request.name, not_found)
        return pb.DeleteCohortResponse()
