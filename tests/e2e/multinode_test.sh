#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair, with addresses that exist
# only inside them. `fabrica init` writes the cluster file; `fabrica train cluster=...` started in
# the first namespace runs 2 workers there and 2 in the second (mpirun reaches it through an rsh
# agent that enters the namespace), talking TCP across the veth. The losses equal one process's.
# Skipped, saying why, where namespaces cannot be made (not root, no iproute2).
# Usage: multinode_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
ns_a=fab-a-$$ ns_b=fab-b-$$
if ! ip netns add $ns_a 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here [needs: root]"
  exit 77
fi
work=$(mktemp -d)
cleanup() {
  ip netns pids $ns_a 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns pids $ns_b 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns del $ns_a 2>/dev/null || true
  ip netns del $ns_b 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add $ns_b
ip link add fva$$ type veth peer name fvb$$
ip link set fva$$ netns $ns_a
ip link set fvb$$ netns $ns_b
ip -n $ns_a addr add 10.77.0.1/24 dev fva$$
ip -n $ns_b addr add 10.77.0.2/24 dev fvb$$
for ns in $ns_a $ns_b; do ip -n $ns link set lo up; done
ip -n $ns_a link set fva$$ up
ip -n $ns_b link set fvb$$ up

cd "$work"
export FABRICA_CACHE="$work/cache" OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# mpirun calls the agent as `agent HOST COMMAND...`; it runs the command inside that host's network
# namespace, under a host name of its own (as a real second machine has: MPI tells nodes apart by it).
cat > agent.sh <<SH
#!/bin/sh
host=\$1; shift
case \$host in 10.77.0.1) ns=$ns_a ;; 10.77.0.2) ns=$ns_b ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns unshare --uts /bin/sh -c "hostname fabrica-\$ns; \$*"
SH
chmod +x agent.sh

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 40
warmup_steps: 2
max_steps: 10
save_steps: 0
YAML

"$fabrica" train run.yaml output_dir=one >one.log 2>&1 || { cat one.log; fail "single process"; }
"$fabrica" init --hosts 10.77.0.1,10.77.0.2 --nproc-per-node 2 --iface 10.77.0.0/24 --rsh-agent "$work/agent.sh" \
  --output cluster.yaml >init.log || { cat init.log; fail "fabrica init"; }
ip netns exec $ns_a "$fabrica" train run.yaml output_dir=two-hosts cluster=cluster.yaml per_device_train_batch_size=1 \
  zero_stage=2 >two-hosts.log 2>&1 || { cat two-hosts.log; fail "training across the namespaces"; }
grep -q "launching 4 workers" two-hosts.log || fail "no launcher line"
python3 - one/metrics.jsonl two-hosts/metrics.jsonl <<'PY' || fail "losses differ"
import json, sys
ref, got = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
assert len(ref) == len(got) and worst < 1e-5, (len(ref), len(got), worst)
assert got[-1]["world_size"] == 4, got[-1]
print(f"ok: 4 workers on 2 hosts over TCP: {len(got)} steps, worst relative difference {worst:.1e}, "
      f"{got[-1]['comm_bytes_sent_per_step']} bytes sent per step per rank")
PY
