from twisted.trial.unittest import SynchronousTestCase

from iop.runtime.events import EventType, RuntimeEvent, Usage
from iop.runtime.spec import AdapterSpec, RuntimeProfile
from iop.wire import runtime_pb2 as pb
from iop.wire.convert import (
    adapter_spec,
    adapter_specs,
    event_from_proto,
    event_to_proto,
    usage_from_proto,
    usage_to_proto,
)


class ConvertTests(SynchronousTestCase):
    def test_usage_round_trip_keeps_unreported_as_none(self) -> None:
        for usage in (
            Usage(1, 2),
            Usage(1, 2, 3, 4),
            Usage(0, 0, 0, None),
            Usage(9, 2, None, 3, 5),
        ):
            self.assertEqual(usage_from_proto(usage_to_proto(usage)), usage)

    def test_event_round_trip(self) -> None:
        event = RuntimeEvent.complete(Usage(3, 4, 1), {"finish_reason": "stop"}, session_id="s")
        message = event_to_proto(event, "run-1", 7, 1234)
        self.assertEqual(
            (message.run_id, message.sequence, message.timestamp_unix_ms), ("run-1", 7, 1234)
        )
        self.assertEqual(event_from_proto(message), event)

    def test_unknown_type_is_an_error(self) -> None:
        event = event_from_proto(pb.RunEvent(run_id="r", sequence=1, type="teleport"))
        self.assertEqual(event.type, EventType.ERROR)
        self.assertIn("teleport", event.error)


class AdapterSpecTests(SynchronousTestCase):
    def test_everyField(self) -> None:
        message = pb.AdapterConfig(
            name="agent",
            type="cli",
            enabled=True,
            base_url="http://10.0.0.5:8000/v1",
            headers={"Authorization": "Bearer k"},
            request_timeout_ms=3000,
            idle_timeout_ms=2000,
            max_concurrency=3,
            command="claude",
            args=["-p", "{model}"],
            env={"HOME": "/h"},
            workspace="/w",
            mode="plan",
            resume_args=["--resume={session_id}"],
            output_format="stream-json",
            prompt_placement="stdin",
            context_size=8192,
            settings={"kill_grace_ms": "10"},
        )
        self.assertEqual(
            adapter_spec(message),
            AdapterSpec(
                name="agent",
                type="cli",
                enabled=True,
                base_url="http://10.0.0.5:8000/v1",
                headers={"Authorization": "Bearer k"},
                request_timeout_ms=3000,
                idle_timeout_ms=2000,
                max_concurrency=3,
                command="claude",
                args=("-p", "{model}"),
                env={"HOME": "/h"},
                workspace="/w",
                mode="plan",
                resume_args=("--resume={session_id}",),
                output_format="stream-json",
                prompt_placement="stdin",
                context_size=8192,
                settings={"kill_grace_ms": "10"},
            ),
        )

    def test_wireDefaults(self) -> None:
        """Unnamed: named after its type; max_concurrency unset: 1; no profile: None."""
        spec = adapter_spec(pb.AdapterConfig(type="vllm"))
        self.assertEqual(
            (spec.name, spec.enabled, spec.max_concurrency, spec.profile), ("vllm", False, 1, None)
        )

    def test_profile(self) -> None:
        message = pb.AdapterConfig(name="a", type="openai_compat")
        message.profile.CopyFrom(
            pb.RuntimeProfile(
                name="p",
                driver="openai_chat",
                operations={"chat_completions": "/v2/chat"},
                capabilities=["chat", "tools"],
                extensions={"thinking": True},
                auth_header="Authorization",
                auth_scheme="Bearer",
            )
        )
        self.assertEqual(
            adapter_spec(message).profile,
            RuntimeProfile(
                name="p",
                driver="openai_chat",
                operations={"chat_completions": "/v2/chat"},
                capabilities=("chat", "tools"),
                extensions={"thinking": True},
                auth_header="Authorization",
                auth_scheme="Bearer",
            ),
        )

    def test_payloadOrder(self) -> None:
        payload = pb.NodeConfigPayload(
            adapters=[pb.AdapterConfig(name="b", type="vllm"), pb.AdapterConfig(type="ollama")]
        )
        self.assertEqual([s.name for s in adapter_specs(payload)], ["b", "ollama"])
