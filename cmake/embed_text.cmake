# Writes IN (a text file) to OUT as a C++ raw string literal, for #include: the chat page goes
# into the qhx binary whole, so `qhx serve` needs no files beside it.
# Usage: cmake -DIN=page.html -DOUT=page.inc -P embed_text.cmake
file(READ "${IN}" content)
set(delimiter "qhx_text")
string(FIND "${content}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains )${delimiter}\": it cannot be a raw string literal")
endif()
file(WRITE "${OUT}.tmp" "R\"${delimiter}(${content})${delimiter}\"\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
