# Which forms of tf_max_nan (codegen/cpp/prelude.py) does this machine's g++ vectorize?
# gen.py writes m.cpp: per form, a channels-last pooling loop, a ReLU and an omp simd max.
# Prints one line per loop. Usage: bash scripts/gcc_max_forms/check.sh (works in a temp dir).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$(mktemp -d)"
python3 "$here/gen.py"
g++ --version | head -1
g++ -O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math -ffp-contract=off -fopt-info-vec-optimized \
    -shared -fPIC m.cpp -o m.so 2> rep.txt
awk -F: '/vectorized/ {print $2}' rep.txt | sort -n | uniq > lines.txt
grep -n "^extern\|for (int64_t x1\|for (int64_t i" m.cpp |
    awk -F: '/extern/ {split($2, a, "("); f = a[1]} /for/ {print $1, f}' > loops.txt
while read -r line fn; do
    if grep -qx "$line" lines.txt || grep -qx "$((line + 1))" lines.txt; then echo "$fn: vectorized"; else echo "$fn: NOT"; fi
done < loops.txt
