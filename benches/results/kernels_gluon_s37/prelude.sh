# Sourced by this folder's run scripts (repo root): the serving harness's setup once per machine
# (SGLang and the wheel in dist/ into /tmp/site), then the installed wheel's kernels replaced by the
# working tree's, and the card's name.
[ -d /tmp/site/sglang ] || { bash benches/serving/run_gpu.sh setup > "$OUT/setup.log" 2>&1; tail -1 "$OUT/setup.log"; }
export PYTHONPATH=/tmp/site:$PWD/python
cp triton_kernels/*.py "$(python3 -c 'import oscar_sgl.kernels as k, os; print(os.path.dirname(k.__file__))')"/
nvidia-smi --query-gpu=name --format=csv,noheader
