# The schedule simulator's own tests (tools/sim, Python 3 standard library), label unit.
# Included from tests/CMakeLists.txt.
find_package(Python3 REQUIRED COMPONENTS Interpreter)  # Debian: python3
add_test(NAME unit_fluxsim_schedule
         COMMAND ${Python3_EXECUTABLE} -m unittest discover -s ${PROJECT_SOURCE_DIR}/tools/sim/tests -v)
set_tests_properties(unit_fluxsim_schedule PROPERTIES LABELS unit TIMEOUT 120 ENVIRONMENT PYTHONDONTWRITEBYTECODE=1)
