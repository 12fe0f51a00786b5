# Call 1 (4 GPUs): GPU tests of the boundary/adversaries/audits/CUDA C, and the honest campaign eagerly
START=$(date +%s); END=$((START + ${1:-560}))
source .device/on-device.sh >/dev/null || exit 1
export PATH=$PATH:/usr/local/cuda/bin
export PYTHONPATH=$PWD:$PYTHONPATH TILELOOP_EXPERIENCE=$(mktemp -d)/exp.jsonl
git config --global user.name tileloop; git config --global user.email tileloop@localhost
REPO=$PWD; R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee $R/device.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $R/device.txt
which nvcc >> $R/device.txt 2>&1; nvcc --version 2>&1 | tail -2 >> $R/device.txt
D=$(mktemp -d); cp -r kernels $D/; (cd $D && git init -q && git add -A && git commit -qm k)
dc() {  # gpu op method multiples
  cd $D; local left=$(( END - $(date +%s) - 40 ))
  CUDA_VISIBLE_DEVICES=$1 timeout $((left + 30)) python3 -m loop decision-check kernels/$2/$2_triton.py --scenarios aa,honest --trials 60 \
    --method $3 --l2-multiples $4 --budget $left --json > $R/dc-$2-$3.json 2> $R/dc-$2-$3.log
  echo "dc $2 $3 rc=$?"
}
tests() {  # gpu name files...
  local g=$1 n=$2; shift 2
  cd $REPO; local left=$(( END - $(date +%s) - 20 ))
  CUDA_VISIBLE_DEVICES=$g timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 "$@" > $R/gpu-$n.txt 2>&1
  echo "tests $n rc=$?"; tail -3 $R/gpu-$n.txt
}
( tests 0 boundary tests/test_isolation.py tests/test_isolation_namespaces.py tests/test_adversaries.py ) &
( tests 1 judge tests/test_audits.py tests/test_drawn.py tests/test_cuda_gpu.py tests/test_recipes_cuda.py
  cd $REPO; CUDA_VISIBLE_DEVICES=1 timeout $(( END - $(date +%s) - 10 )) python3 -m loop doctor > $R/doctor.txt 2>&1; echo doctor rc=$? ) &
dc 2 vector_add eager 1,4 &
dc 3 softmax eager 0.25,10 &
wait
cd $REPO; python3 - <<PY
import json, glob
for f in sorted(glob.glob("$R/dc-*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    c = d.get("counts", {})
    print(f.split("/")[-1], "done", d.get("trials_done"), "judged", d.get("judged_measurements"), "wall", d.get("wall_s"),
          "counts", c, "failure", (d.get("failure") or {}).get("status"))
PY
tar czf $OUT/call1.tgz -C $R . ; echo "total $(( $(date +%s) - START )) s"
