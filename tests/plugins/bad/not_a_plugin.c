/* A shared library that is not an sbx plugin: it lacks the sbx_plugin_entry symbol. */
int not_a_plugin_answer(void) {
  return 42;
}
