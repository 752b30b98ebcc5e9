# xgrammar (Apache-2.0, github.com/mlc-ai/xgrammar): the grammar engine behind structured output
# (docs/structured_output.md says why this one). Debian does not package it; its C++ core comes
# from the source distribution on PyPI, pinned by version and hash, downloaded once into
# .deps/ of the source tree (or given as QHX_XGRAMMAR_SOURCE_DIR), and built here as a static
# library of our own target: its Python bindings, -Werror and LTO left out.
set(QHX_XGRAMMAR_VERSION 0.2.9)
set(QHX_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(QHX_XGRAMMAR_URL
    "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${QHX_XGRAMMAR_VERSION}.tar.gz")
set(QHX_XGRAMMAR_SOURCE_DIR "${PROJECT_SOURCE_DIR}/.deps/xgrammar-${QHX_XGRAMMAR_VERSION}"
    CACHE PATH "Unpacked xgrammar source distribution")

if(NOT EXISTS "${QHX_XGRAMMAR_SOURCE_DIR}/include/xgrammar/xgrammar.h")
  set(archive "${PROJECT_SOURCE_DIR}/.deps/xgrammar-${QHX_XGRAMMAR_VERSION}.tar.gz")
  if(NOT EXISTS "${archive}")
    message(STATUS "Downloading xgrammar ${QHX_XGRAMMAR_VERSION} from PyPI")
    file(DOWNLOAD "${QHX_XGRAMMAR_URL}" "${archive}.part" EXPECTED_HASH SHA256=${QHX_XGRAMMAR_SHA256}
         STATUS download_status TLS_VERIFY ON)
    list(GET download_status 0 download_code)
    if(NOT download_code EQUAL 0)
      list(GET download_status 1 download_message)
      message(FATAL_ERROR "xgrammar: download of ${QHX_XGRAMMAR_URL} failed (${download_message}); "
              "download it by hand to ${archive}")
    endif()
    file(RENAME "${archive}.part" "${archive}")
  endif()
  file(SHA256 "${archive}" archive_hash)
  if(NOT archive_hash STREQUAL QHX_XGRAMMAR_SHA256)
    message(FATAL_ERROR "xgrammar: ${archive} has sha256 ${archive_hash}, not ${QHX_XGRAMMAR_SHA256}")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${PROJECT_SOURCE_DIR}/.deps")
endif()

# One change to its JSON grammars, made in place (idempotent): the whitespace between JSON tokens
# becomes llama.cpp's -- nothing, a space, or a line break and up to max_whitespace_cnt spaces or
# tabs of indentation -- instead of up to max_whitespace_cnt of any whitespace, with which a weak
# model fills every gap with line breaks (docs/structured_output.md).
set(converter "${QHX_XGRAMMAR_SOURCE_DIR}/cpp/json_schema_converter.cc")
file(READ "${converter}" converter_text)
set(any_whitespace [=[
  return Repeat(
      "whitespace",
      builder_.AddCharacterClass(elements),
      0,
      static_cast<int32_t>(*max_whitespace_cnt_)
  );]=])
set(indentation [=[
  return Choice(
      {Empty(),
       ByteString(" "),
       Sequence(
           {ByteString("\n"),
            Repeat(
                "whitespace",
                builder_.AddCharacterClass({{' ', ' '}, {'\t', '\t'}}),
                0,
                static_cast<int32_t>(*max_whitespace_cnt_)
            )}
       )}
  );  // qhx: indentation]=])
string(FIND "${converter_text}" "${any_whitespace}" unpatched)
if(NOT unpatched EQUAL -1)
  string(REPLACE "${any_whitespace}" "${indentation}" converter_text "${converter_text}")
  file(WRITE "${converter}" "${converter_text}")
endif()
string(FIND "${converter_text}" "${indentation}" patched)
if(patched EQUAL -1)
  message(FATAL_ERROR "xgrammar: ${converter} is not the ${QHX_XGRAMMAR_VERSION} this build patches")
endif()

file(GLOB_RECURSE xgrammar_sources CONFIGURE_DEPENDS "${QHX_XGRAMMAR_SOURCE_DIR}/cpp/*.cc")
list(FILTER xgrammar_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
# Its log goes to our sink (src/grammar/xgrammar_log.cc), not to stderr.
add_library(qhx_xgrammar STATIC ${xgrammar_sources} "${PROJECT_SOURCE_DIR}/src/grammar/xgrammar_log.cc")
target_include_directories(qhx_xgrammar PRIVATE "${QHX_XGRAMMAR_SOURCE_DIR}/cpp" "${PROJECT_SOURCE_DIR}/src")
target_include_directories(qhx_xgrammar PUBLIC "${QHX_XGRAMMAR_SOURCE_DIR}/include")
target_include_directories(qhx_xgrammar SYSTEM PUBLIC "${QHX_XGRAMMAR_SOURCE_DIR}/3rdparty/picojson"
                           "${QHX_XGRAMMAR_SOURCE_DIR}/3rdparty/dlpack/include")
target_compile_definitions(qhx_xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 PRIVATE XGRAMMAR_LOG_CUSTOMIZE=1)
set_target_properties(qhx_xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
# Someone else's code: its warnings are not ours to fix.
target_compile_options(qhx_xgrammar PRIVATE -w)
# Nor are its bugs ours to hunt: the sanitizer builds take it as they take libstdc++ or ICU,
# uninstrumented and without debug information (half their time to build it). Calls into it
# from our code are still checked on our side.
if(QHX_SANITIZE OR QHX_TSAN OR QHX_FUZZ)
  target_compile_options(qhx_xgrammar PRIVATE -fno-sanitize=all -g0)
endif()
target_link_libraries(qhx_xgrammar PUBLIC Threads::Threads)
