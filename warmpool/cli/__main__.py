from warmpool.cli.main import main

main()
