"""Static files of digits-memplugin (CSS, JS, npm-installed vendor libraries), shipped as digits_memplugin.static."""
