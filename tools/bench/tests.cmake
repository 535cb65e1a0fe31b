# Tests of the benchmark tools, label unit. Included from tests/CMakeLists.txt.
# The pipelined step it times for the schedule model's calibration (tools/sim/calibrate.py) runs
# on a narrow FLUX.1 transformer and is printed.
add_test(NAME unit_bench_matmul_patched_step
         COMMAND fluxmpi-bench-matmul --config ${PROJECT_SOURCE_DIR}/share/fluxmpi/models/FLUX.1-dev/transformer/config.json
                 --double 1 --single 1 --heads 2 --head-dim 16 --height 64 --width 64 --msl 8 --repeat 1 --patches 2)
set_tests_properties(unit_bench_matmul_patched_step PROPERTIES LABELS unit TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "fp32: patched step \\(2 patches\\): [0-9.]+ ms")

# tools/bench/rss_sample.py on a one-process job of the demo model: one row, peak split into
# anonymous and file pages.
add_test(NAME unit_bench_rss_sample
         COMMAND sh -c "rm -rf rss-model && $<TARGET_FILE:make-tiny-model> --out rss-model >/dev/null && \
                        ${PROJECT_SOURCE_DIR}/tools/bench/rss_sample.py -- $<TARGET_FILE:fluxmpi> --model rss-model \
                        --prompt x --steps 1 --height 64 --width 64 --threads 1 --no-progress -o rss-sample.png"
         WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(unit_bench_rss_sample PROPERTIES LABELS unit TIMEOUT 120
                     PASS_REGULAR_EXPRESSION "\\| [0-9]+ \\| [0-9.]+ MiB \\([0-9.]+ \\+ [0-9.]+\\) \\| [0-9.]+ MiB \\|")
