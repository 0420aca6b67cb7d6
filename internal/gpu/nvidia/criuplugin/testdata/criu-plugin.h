/* The few names of CRIU's criu-plugin.h the plugin uses, for the harness: hooks become
 * plain functions it calls, and the image directory is the harness's. */
#include <stdint.h>
#include <sys/stat.h>
#define CR_PLUGIN_REGISTER_HOOK(hook, func)
#define CR_PLUGIN_REGISTER_DUMMY(name)
int criu_get_image_dir(void);
