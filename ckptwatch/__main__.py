from ckptwatch.cli import main

main()
