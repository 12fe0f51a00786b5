# usage: bash .device/scripts/camp.sh <total seconds>
START=$(date +%s); END=$((START + $1))
source .device/on-device.sh >/dev/null || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH TILELOOP_EXPERIENCE=/tmp/exp.jsonl
git config --global user.name tileloop; git config --global user.email tileloop@localhost
REPO=$PWD; D=/tmp/camp; rm -rf $D; mkdir -p $D; cp -r kernels $D/; (cd $D && git init -q && git add -A && git commit -qm k)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
dc() {  # gpu op method multiples
  cd $D; local left=$(( END - $(date +%s) - 100 ))
  CUDA_VISIBLE_DEVICES=$1 python3 -m loop decision-check kernels/$2/$2_triton.py --scenarios aa,honest --trials 60 \
    --method $3 --l2-multiples $4 --budget $left --json > $OUT/$2-$3.json 2> $OUT/$2-$3.log
  echo "$2 $3 rc=$?"
}
dc 0 vector_add graph 0.25,10 &
dc 1 vector_add eager 1,4 &
dc 2 softmax graph 1,4 &
( cd $REPO && CUDA_VISIBLE_DEVICES=3 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_isolation.py > $OUT/gpu-isolation.txt 2>&1; tail -3 $OUT/gpu-isolation.txt; dc 3 softmax eager 0.25,10 ) &
wait
cd $REPO; python3 -m loop doctor > $OUT/doctor.txt 2>&1
python3 - <<PY
import json, glob
for f in sorted(glob.glob("$OUT/*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable", e); continue
    c = d.get("counts", {})
    print(f.split("/")[-1], "done", d.get("trials_done"), "judged", d.get("judged_measurements"), "wall", d.get("wall_s"),
          "honest_refusals", c.get("honest_refusals"), "failure", (d.get("failure") or {}).get("status"))
PY
echo "total $(( $(date +%s) - START )) s"
